#!/usr/bin/env bash
# Every check that needs a CUDA device, in one run, for a GPU machine lent for a few minutes: the CUDA tests,
# benchmarks/gpu.py, then the whole suite in the time left (torch and the other packages as that machine has them).
#
#     bash benchmarks/gpu_check.sh [OUTDIR] [SECONDS]
#
# Logs go to OUTDIR (default $OUT, else /tmp/gpu_check): cuda_tests.log, gpu.log, suite.log. SECONDS (default 450)
# bounds the whole run; each stage has its own limit inside it, so a slow stage still leaves the logs of the others.
set -u
out=${1:-${OUT:-/tmp/gpu_check}}
total=${2:-450}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
left() { echo $(( total - SECONDS > 10 ? total - SECONDS : 10 )); }
{ nvidia-smi -L; python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$out/cuda_tests.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs -s tests/test_cuda.py \
    tests/test_core.py::test_cuda_events_and_sync_paths tests/test_metrics_memory.py::test_real_cuda_forward_delta \
    tests/test_roofline.py::test_peaks_on_cuda 2>&1 | tee -a "$out/cuda_tests.log"
timeout $(( $(left) < 200 ? $(left) : 200 )) python3 benchmarks/gpu.py --repeats 20 2>&1 | grep -v USDT | tee "$out/gpu.log"
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
timeout "$(left)" python3 -m pytest -v --tb=line -rfE -p no:cacheprovider $xdist tests > "$out/suite.log" 2>&1
echo "suite: rc $?" >> "$out/suite.log"
tail -40 "$out/suite.log"
