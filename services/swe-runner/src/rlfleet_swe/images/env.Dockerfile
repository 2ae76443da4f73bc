# The environment every tiny SWE instance image starts from: rlfleet's base image (Debian
# bookworm + Python 3.11, deploy/docker/build-base.sh) plus git and pytest from Debian,
# and an unprivileged user that owns the repository, so tests never run as root.
ARG BASE=rlfleet/base:bookworm
FROM ${BASE}
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends git python3-pytest >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 swe \
 && mkdir /testbed && chown swe:swe /testbed
