#!/usr/bin/env bash
# Every check that needs a CUDA device, in one run, for a GPU machine lent for a few minutes: the CUDA tests, the
# command line on CUDA, benchmarks/gpu.py, the checkpoint plans' peaks (benchmarks/checkpoint_peak.py, by saved
# bytes and by peak), then the whole suite in the time left (torch and the other packages as that machine has them).
#
#     bash benchmarks/gpu_check.sh [OUTDIR] [SECONDS]
#
# Logs go to OUTDIR (default $OUT, else /tmp/gpu_check): stages.log (when each stage began), cuda_tests.log, cli.log,
# gpu.log, peak_saved.log, peak_budget.log, suite.log. SECONDS (default 450) bounds the whole run; each stage has its own limit inside it, so a
# slow stage still leaves the logs of the others.
set -u
out=${1:-${OUT:-/tmp/gpu_check}}
total=${2:-450}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
left() { echo $(( total - SECONDS > 10 ? total - SECONDS : 10 )); }
cap() { local want=$1 have; have=$(left); echo $(( have < want ? have : want )); }
stage() { echo "== $1: $(( SECONDS ))s into the run, $(left)s left" | tee -a "$out/stages.log"; }
{ nvidia-smi -L; python3 -c "import sys, torch, anytree; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$out/cuda_tests.log"
stage "CUDA tests"
timeout "$(cap 120)" python3 -m pytest -q -p no:cacheprovider -rs -s tests/test_cuda.py \
    tests/test_core.py::test_cuda_events_and_sync_paths tests/test_metrics_memory.py::test_real_cuda_forward_delta \
    tests/test_roofline.py::test_peaks_on_cuda 2>&1 | tee -a "$out/cuda_tests.log"
stage "command line"
{ timeout "$(cap 60)" python3 -m layerprof torchvision.models:resnet18 --input 8,3,224,224 --device cuda \
    --depth 1 --checkpoint-budget 50% --allow-side-effects; echo "cli: rc $?"; } > "$out/cli.log" 2>&1
tail -5 "$out/cli.log"
stage "gpu.py"
timeout "$(cap 230)" python3 benchmarks/gpu.py --repeats 15 --both-prices 2>&1 | grep -v USDT | tee "$out/gpu.log"
stage "checkpoint_peak.py (saved budgets)"
timeout "$(cap 90)" python3 benchmarks/checkpoint_peak.py --device cuda --models bert-base,gpt2,resnet50 2>&1 \
    | grep -v USDT | tee "$out/peak_saved.log"
stage "checkpoint_peak.py --peak"
timeout "$(cap 90)" python3 benchmarks/checkpoint_peak.py --device cuda --peak --models bert-base,gpt2,resnet50 2>&1 \
    | grep -v USDT | tee "$out/peak_budget.log"
stage "suite"
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12 --dist loadgroup")
timeout "$(left)" python3 -m pytest -v --tb=line -rfE -p no:cacheprovider $xdist tests > "$out/suite.log" 2>&1
echo "suite: rc $?" >> "$out/suite.log"
tail -40 "$out/suite.log"
