#!/usr/bin/env bash
# exp.sh 'python patch on s' [defines...]: compiles a patched fwd_sm90 (D128 bf16 by default) and prints the steady loop's event order
set -e
cd /work/main
cp kernels/fwd_sm90.cu kernels/_exp.cu
python3 -c "
p='kernels/_exp.cu'; s=open(p).read()
$1
open(p,'w').write(s)"
shift
CUBIN=/tmp/exp/x.cubin .venv/bin/python scratch/nvcomp.py sm_90a kernels/_exp.cu -DFC_DTYPE_BF16=1 "${@:--DFC_HEAD_DIM=128}" | grep -E "Used|spill" | tr -s ' ' | tr '\n' ' '; echo
.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvdisasm -c /tmp/exp/x.cubin > /tmp/exp/x.sass
python3 scratch/loopseq.py /tmp/exp/x.sass 2>/dev/null | grep -m1 "HGMMAx11\|HGMMAx" | sed -E 's/(MUFU|F2FP)(x[0-9]+)? //g' | cut -c1-600
