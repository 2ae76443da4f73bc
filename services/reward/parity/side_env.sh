#!/usr/bin/env bash
# Build a side environment with NeMo-Gym 0.7.0's resources servers, for parity tests and
# the side-by-side benchmark. nemo-gym declares Python >= 3.13 but its servers import and
# run on 3.11: the wheel is installed without its dependency check, then what the servers
# import. Needs only the package index.
#
#   services/reward/parity/side_env.sh DIR        # then:
#   export RLFLEET_NEMO_GYM_PYTHON=DIR/venv/bin/python RLFLEET_NEMO_GYM_SRC=DIR/src
set -euo pipefail
dir=${1:?usage: side_env.sh DIR}
python=${PYTHON:-python3}
mkdir -p "$dir/wheel" "$dir/src"
"$python" -m venv "$dir/venv"
pip="$dir/venv/bin/pip"
"$pip" download -q --no-deps --python-version 3.13.14 --only-binary=:all: -d "$dir/wheel" nemo-gym==0.7.0
wheel=$(ls "$dir"/wheel/nemo_gym-0.7.0-*.whl)
# The servers live beside the package in the wheel (resources_servers/...): unpack it too.
(cd "$dir/src" && "$dir/venv/bin/python" -m zipfile -e "$wheel" .)
"$pip" install -q --no-deps --ignore-requires-python "$wheel"
"$pip" install -q "openai==2.44.0" "anthropic<=0.109.2" tqdm pydantic pydantic_core devtools \
  "packaging>=24.2" fastapi "mcp<2,>=1.28.1" "anyio>=4.15.1" itsdangerous uvicorn httptools \
  uvloop hydra-core omegaconf rich "scipy>=1.14.1" "aiohttp>=3.14.4" jinja2 psutil orjson \
  "urllib3>=2.8.0" PyJWT requests defusedxml pydot "mlflow>=3.16.1" "ray[default]" yappi wandb \
  datasets tiktoken "math-verify[antlr4_9_3]==0.8.0" "openapi-schema-validator==0.6.3" \
  "tomli-w==1.2.0" "xmltodict==1.0.2" jsonschema reasoning-gym
# instruction_following checks with verifiable-instructions, published only on GitHub: from
# an unpacked copy when VI_SRC names one, else from git. It needs no NLTK data except punkt
# for six ids (which cannot be downloaded everywhere; the parity generator leaves them out).
"$pip" install -q --no-deps "${VI_SRC:-git+https://github.com/abukharin-nv/verifiable-instructions.git}"
"$pip" install -q nltk langdetect absl-py immutabledict regex
echo "export RLFLEET_NEMO_GYM_PYTHON=$dir/venv/bin/python RLFLEET_NEMO_GYM_SRC=$dir/src"
