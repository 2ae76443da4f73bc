# One tiny SWE instance: its repository at base_commit in /testbed. The repository comes
# as a diff from nothing (repo.patch) and is committed with a fixed author and date, so
# the commit id equals the instance's base_commit; the build fails if it does not.
ARG ENV_IMAGE
FROM ${ENV_IMAGE}
ARG BASE_COMMIT
COPY --chown=swe:swe repo.patch /tmp/repo.patch
USER swe
WORKDIR /testbed
RUN export GIT_AUTHOR_NAME=rlfleet GIT_AUTHOR_EMAIL=swe-tiny@rlfleet.invalid \
      GIT_AUTHOR_DATE=2026-01-01T00:00:00+0000 GIT_COMMITTER_NAME=rlfleet \
      GIT_COMMITTER_EMAIL=swe-tiny@rlfleet.invalid GIT_COMMITTER_DATE=2026-01-01T00:00:00+0000 \
 && git -c init.defaultBranch=main init -q && git apply /tmp/repo.patch && git add -A \
 && git -c commit.gpgsign=false commit -q -m base && rm /tmp/repo.patch \
 && test "$(git rev-parse HEAD)" = "${BASE_COMMIT}"
