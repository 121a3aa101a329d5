#!/usr/bin/env bash
# GPU activity on a GPU machine, in one command there (README, Development):
#
#   tests/gpu/run.sh fetch   # here, with a package index: the wheels the GPU machine lacks,
#                            # into tests/gpu/.carry (ignored by git; it travels with the checkout)
#   tests/gpu/run.sh         # there: installs them and the project into tests/gpu/.carry/site
#                            # (the native CUPTI reader built against the machine's CUPTI
#                            # headers), runs tests/gpu/measure.py: the PTB-shaped RNN
#                            # (tests/gpu/ptb.py), the CNN at batch 16 and 512, each with GPU
#                            # activity off, on with every API call recorded (the CNN), and
#                            # on with only the launching calls recorded (the default; the
#                            # RNN also with CUPTI and the reader alone, with and without the
#                            # calls: reader_only.py, and with a capture window of 10 of
#                            # its 50 iterations),
#                            # rotated three times; then the gpu-marked tests; CUPTI_READER=python:
#                            # cupti-python's reader instead of the native one
#
# GPU_PYTHON_VERSION (default 3.12): the GPU machine's Python, for the wheels fetched here.
# CUPTI_PYTHON (default cupti-python, the newest: CUDA 13): e.g. "cupti-python>=12.6,<13" for
# CUDA 12.  PYTHON: the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=tests/gpu/.carry
PY=${PYTHON:-python3}

if [ "${1:-}" = fetch ]; then
    mkdir -p "$CARRY/wheels"
    # Chainer 7.8.1 is a source package (its setup needs setuptools < 70): its wheel, built here
    PIP_CONSTRAINT=constraints.txt PIP_BUILD_CONSTRAINT=constraints.txt \
        "$PY" -m pip wheel --no-deps -w "$CARRY/wheels" chainer==7.8.1
    # Only what the GPU machine's image lacks: it holds NumPy, CuPy, pandas, pytest,
    # hypothesis, wrapt, cuda-bindings and the nvidia wheels (nvidia-cuda-cupti's libcupti
    # matching its driver: a newer one carried along would not load there).
    "$PY" -m pip download --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" \
        --no-deps -d "$CARRY/wheels" nvtx "${CUPTI_PYTHON:-cupti-python}" pyelftools \
        holistictraceanalysis==0.5.0 plotly
    echo "tests/gpu/run.sh fetch: $(ls "$CARRY/wheels" | wc -l) wheels in $CARRY/wheels"
    exit 0
fi

"$PY" -c 'import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0' || {
    echo "tests/gpu/run.sh: needs CuPy and a CUDA GPU here" >&2; exit 2; }
[ -d "$CARRY/wheels" ] || {
    echo "tests/gpu/run.sh: no $CARRY/wheels: run 'tests/gpu/run.sh fetch' first" >&2; exit 2; }
SITE=$CARRY/site
rm -rf "$SITE"
mkdir -p "$SITE"
"$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "$CARRY"/wheels/*.whl
export PYTHONPATH=$PWD/$SITE  # the build finds the nvidia wheels' headers there
"$PY" -m pip install --quiet --no-deps --no-build-isolation --ignore-requires-python \
    --target "$SITE" .
cp tests/gpu/harness/sitecustomize.py "$SITE/"  # Chainer 7.8.1 on Python 3.12 and NumPy 2
# the tests and measure.py run this checkout: its extensions built in place
"$PY" -c 'from chainer_autoprof.runtime.hotpath import build; build.build_in_place()
build.build_cupti_in_place()
from chainer_autoprof.runtime import cupti_native; cupti_native.load_extension()' \
    && echo "tests/gpu/run.sh: native CUPTI reader built" \
    || echo "tests/gpu/run.sh: native CUPTI reader NOT built: GPU activity reads cupti-python"
if [ -n "${CUPTI_READER:-}" ]; then export CHAINER_AUTOPROF_CUPTI_READER=$CUPTI_READER; fi
status=0
"$PY" tests/gpu/measure.py || status=1
"$PY" -m pytest -q -p no:cacheprovider -m gpu tests || status=1
exit $status
