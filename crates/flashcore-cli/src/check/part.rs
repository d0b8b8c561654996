//! `flashcore check --part K/N`: a share of a run's cases, so that a long run can be split
//! over several calls.

/// A share of a run's cases (`--part K/N`): the cases whose index in the run is K - 1 mod N.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Part {
    pub k: usize,
    pub n: usize,
}

/// `--part K/N` (clap's parser for it).
pub fn parse_part(s: &str) -> std::result::Result<Part, String> {
    let bad = || format!("{s:?}: want K/N with 1 <= K <= N, e.g. 2/3");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n) = (k.trim().parse::<usize>().map_err(|_| bad())?, n.trim().parse::<usize>().map_err(|_| bad())?);
    if k == 0 || k > n {
        return Err(bad());
    }
    Ok(Part { k, n })
}

/// Keeps a part's cases of lists taken in run order (the index runs on across lists).
pub struct PartFilter {
    pub part: Option<Part>,
    pub next: usize,
}

impl PartFilter {
    pub fn take<T>(&mut self, cases: Vec<T>) -> Vec<T> {
        let start = self.next;
        self.next += cases.len();
        let keep = |i: usize| self.part.is_none_or(|p| (start + i) % p.n == p.k - 1);
        cases.into_iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, c)| c).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_one_count_cover_the_run_once() {
        let lists = [vec![0, 1, 2], vec![], vec![3, 4, 5, 6], vec![7]];
        let mut seen = Vec::new();
        for k in 1..=3 {
            let mut part = PartFilter { part: Some(Part { k, n: 3 }), next: 0 };
            for list in &lists {
                seen.extend(part.take(list.clone()));
            }
        }
        seen.sort();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        let mut whole = PartFilter { part: None, next: 0 };
        assert_eq!(whole.take(vec![1, 2, 3]), vec![1, 2, 3]);
    }

    #[test]
    fn a_part_is_k_of_n() {
        assert_eq!(parse_part("2/3"), Ok(Part { k: 2, n: 3 }));
        for bad in ["0/3", "4/3", "3", "a/b", "1/0"] {
            assert!(parse_part(bad).is_err(), "{bad}");
        }
    }
}
