#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the wheels `benchmarks/gpu/speed_checks.sh serve` needs on the
# GPU machine, whose image lacks the server's stack (FastAPI, uvicorn, pydantic) and the OpenAI
# client and cannot download them: Python 3.12, x86-64 Linux. Run here (with network) from the
# repository root, then name .whl in the device call's carry; speed_checks.sh installs what it finds
# there. One version of each package, with the dependencies the image lacks or holds too old.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 \
    annotated-doc==0.0.7 typing-inspection==0.4.2 opentelemetry-api==1.45.2 uvicorn==0.54.0 click==8.5.1 \
    h11==0.16.0 openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1 \
    anyio==4.16.0 idna==3.20 typing-extensions==4.16.0
ls .whl
du -sh .whl
