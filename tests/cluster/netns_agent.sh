#!/bin/sh
# Open MPI's launch agent for tests/cluster/test_several_hosts.py: it stands in
# for ssh, so mpirun (plm rsh) calls it the way it calls ssh:
#
#   netns_agent.sh [options] HOST COMMAND...
#
# where COMMAND is a shell command line (the orted and its arguments, quoted
# for a remote shell). Instead of logging into HOST, the agent enters HOST's
# network namespace, gives the process a UTS namespace of its own with HOST as
# its host name (what Open MPI and mixtrain's rank table see), and runs
# COMMAND with a shell, as sshd would.
#
# NETNS_AGENT_HOSTS maps host names to namespaces: "hostA=ns1 hostB=ns2".
set -eu

# ssh-style options (Open MPI adds some only for ssh itself, and plm_rsh_args
# could add more): none takes a value here, so skip them all.
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "netns_agent.sh: usage: netns_agent.sh [options] HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift

ns=
for pair in ${NETNS_AGENT_HOSTS:-}; do
  if [ "${pair%%=*}" = "$host" ]; then
    ns=${pair#*=}
  fi
done
if [ -z "$ns" ]; then
  echo "netns_agent.sh: no namespace for host '$host' in NETNS_AGENT_HOSTS='${NETNS_AGENT_HOSTS:-}'" >&2
  exit 255  # ssh's status when it cannot reach the host
fi

# A login through ssh starts from a clean environment: mpirun's own variables
# must not leak into the orted, or this launch would work where ssh would not
# (the MCA parameters travel on the orted's command line, the -x variables in
# its launch message). The command line is one shell string, as ssh sends it.
# shellcheck disable=SC2016  # "$1" and "$*" are the inner shell's, in the namespace
exec ip netns exec "$ns" unshare --uts -- \
  env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/root}" \
  sh -c 'hostname "$1" && shift && exec sh -c "$*"' netns_agent "$host" "$@"
