# rlfleet reward service. Built by deploy/docker/build-images.sh, which prepares the
# context: requirements.txt (uv.lock pins), wheels/ (local-only third-party wheels),
# rlfleet/ (our packages), ca.pem.
#
# Two stages: some of the verifiers' dependencies ship only as source (pycosat, via
# reasoning-gym, is a C extension), so the third-party packages are installed where a
# compiler is, and only the finished /opt/rlfleet is copied into the runtime image.
FROM rlfleet/base:bookworm AS deps
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends gcc libc6-dev python3-dev >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY ca.pem /etc/ssl/certs/build-ca.pem
COPY requirements.txt /build/requirements.txt
COPY wheels /build/wheels
RUN python3 -m venv /opt/rlfleet \
 && PIP_CERT=/etc/ssl/certs/build-ca.pem /opt/rlfleet/bin/pip install --no-cache-dir -q \
      --find-links /build/wheels -r /build/requirements.txt

FROM rlfleet/base:bookworm
# Reused (cached) until uv.lock changes.
COPY --from=deps /opt/rlfleet /opt/rlfleet
# rlfleet's own packages: a code change rebuilds only this layer.
COPY rlfleet /build/rlfleet
RUN /opt/rlfleet/bin/pip install --no-cache-dir -q --no-deps /build/rlfleet/*.whl \
 && rm -rf /build
ENV PATH=/opt/rlfleet/bin:$PATH PYTHONUNBUFFERED=1
EXPOSE 50051 8000
HEALTHCHECK --interval=5s --timeout=4s --start-period=120s --retries=3 \
  CMD ["python", "-m", "rlfleet_core.healthz", "http://127.0.0.1:8000/healthz"]
CMD ["rlfleet-reward", "--host", "0.0.0.0", "--port", "50051", "--http-port", "8000"]
