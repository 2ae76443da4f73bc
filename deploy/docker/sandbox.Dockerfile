# rlfleet sandbox service. Built by deploy/docker/build-images.sh, which prepares the
# context: requirements.txt (uv.lock pins), wheels/ (local-only third-party wheels),
# rlfleet/ (our packages), ca.pem.
FROM rlfleet/base:bookworm
# The service isolates every run with bubblewrap; the runner loads its seccomp filter
# through libseccomp (named here, although apt already depends on it).
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap libseccomp2 && rm -rf /var/lib/apt/lists/*
COPY ca.pem /etc/ssl/certs/build-ca.pem
COPY requirements.txt /build/requirements.txt
COPY wheels /build/wheels
# Third-party packages first: this layer is reused until uv.lock (or a local wheel) changes.
RUN python3 -m venv /opt/rlfleet \
 && PIP_CERT=/etc/ssl/certs/build-ca.pem /opt/rlfleet/bin/pip install --no-cache-dir -q \
      --find-links /build/wheels -r /build/requirements.txt
# Then rlfleet's own packages: a code change rebuilds only this layer.
COPY rlfleet /build/rlfleet
RUN /opt/rlfleet/bin/pip install --no-cache-dir -q --no-deps /build/rlfleet/*.whl \
 && rm -rf /build /etc/ssl/certs/build-ca.pem
ENV PATH=/opt/rlfleet/bin:$PATH PYTHONUNBUFFERED=1
EXPOSE 50051 8000
HEALTHCHECK --interval=5s --timeout=4s --start-period=120s --retries=3 \
  CMD ["python", "-m", "rlfleet_core.healthz", "http://127.0.0.1:8000/healthz"]
CMD ["rlfleet-sandbox", "--host", "0.0.0.0", "--port", "50051", "--http-port", "8000"]
