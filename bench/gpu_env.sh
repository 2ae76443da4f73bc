# Source from the repository root on a bare GPU machine (Python 3.12, torch, transformers,
# nothing else of rlfleet's dependencies, no network): installs the wheels in the folders
# given (carried from a machine with PyPI; see bench/gpu_grpo.sh's header for the list and
# the `pip download` line) into /tmp/site, gives every rlfleet package of the source tree
# a minimal *.dist-info (they read their version with importlib.metadata) and puts the
# source tree on PYTHONPATH.
#   source bench/gpu_env.sh .whl/grpo [.whl/mega ...]
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site $(for d in "$@"; do ls "$d"/*.whl; done) || return 1
for d in libs/* services/*; do
  n=$(sed -n 's/^name = "\(.*\)"/\1/p' $d/pyproject.toml | head -1)
  v=$(sed -n 's/^version = "\(.*\)"/\1/p' $d/pyproject.toml | head -1)
  [ -n "$n" ] || continue
  info=/tmp/site/${n//-/_}-${v:-0.0.0}.dist-info
  mkdir -p $info && printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' $n ${v:-0.0.0} > $info/METADATA
done
export PYTHONPATH=/tmp/site:$(ls -d $PWD/libs/*/src $PWD/services/*/src | tr '\n' ':')
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
