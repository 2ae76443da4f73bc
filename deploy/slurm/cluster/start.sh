#!/bin/bash
# Starts munge, MariaDB, slurmdbd, slurmctld and five slurmd (node1..node5), then waits
# (the container's PID 1 is docker's init when run with --init). Logs: /var/log/slurm/.
set -euo pipefail
# The nodes' names resolve to this container (services publish `<node>:<port>`).
echo "$(hostname -i) node1 node2 node3 node4 node5" >> /etc/hosts
mkdir -p /run/munge /run/mysqld /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
chown munge:munge /run/munge
chown mysql:mysql /run/mysqld
runuser -u munge -- /usr/sbin/munged
mysqld_safe --skip-networking=0 --bind-address=127.0.0.1 >/var/log/slurm/mysqld.log 2>&1 &
until mysqladmin ping --silent >/dev/null 2>&1; do sleep 0.2; done
slurmdbd
# slurmctld registers the cluster with slurmdbd when it comes up.
until sacctmgr -n list cluster >/dev/null 2>&1; do sleep 0.2; done
slurmctld
for n in 1 2 3 4 5; do mkdir -p /var/spool/slurmd/node$n; slurmd -N node$n; done
echo "slurm started"
exec sleep infinity
