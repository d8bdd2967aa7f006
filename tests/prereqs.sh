#!/usr/bin/env bash
# What the test suite needs from the machine, made sure of before pytest starts (`make test`
# runs this first; so does `.ci/run`, through `make test`).
#
#   tests/prereqs.sh           install and start what is missing when run as root with apt-get;
#                              otherwise print one line per missing piece and exit 1
#   tests/prereqs.sh --check   only report, never install or start anything
#
# The pieces: Python's venv module (to make .venv), the OpenSSH server and client (the tests'
# GPU nodes are real sshd processes on loopback), Debian's Chromium (the fleet page in a real
# browser), Debian's docker-compose (validates docker-compose.yaml; no Docker engine needed),
# and PostgreSQL answering on 127.0.0.1:5432 to user postgres without a password
# (the store suite and the two-scheduler test). Programs are looked up on PATH only; the
# Makefile adds /usr/sbin and /sbin, where Debian puts sshd, for users whose PATH lacks them.
#
# Exit status: 0 when everything is there (after installing, as root), 1 when something is
# missing (each line says what and the exact command that installs or starts it), 2 on a bad
# argument.
set -uo pipefail

mode=install
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "tests/prereqs.sh: unknown argument '$1'; expected nothing or --check" >&2; exit 2 ;;
esac

PY=${PY:-python3}
PG_HOST=127.0.0.1
PG_PORT=5432

have() { command -v "$1" >/dev/null 2>&1; }

can_install=0
if [ "$mode" = install ] && [ "$(id -u)" = 0 ] && have apt-get; then
  can_install=1
fi

# -- programs and the Debian packages that bring them -----------------------------------------
packages=()   # to install
missing=()    # lines to print when we cannot install
need() {  # need PACKAGE WHAT
  packages+=("$1")
  missing+=("missing: $2; install it with: sudo apt-get install -y $1")
}

if [ ! -f .venv/pyvenv.cfg ] && ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need python3-venv "Python's venv module for $PY (make creates .venv with it)"
fi
have sshd || need openssh-server "the OpenSSH server (sshd), for the tests' GPU nodes on loopback"
{ have ssh && have ssh-keygen; } \
  || need openssh-client "the OpenSSH client (ssh, ssh-keygen), for the tests' node keys"
have chromium || need chromium "Debian's Chromium (chromium), for the fleet page tests"
have psql || need postgresql "PostgreSQL (psql and a server), for the store suite"
have docker-compose \
  || need docker-compose "Debian's docker-compose, to validate docker-compose.yaml (no engine needed)"

installed_pg=0
if [ ${#packages[@]} -gt 0 ] && [ "$can_install" = 1 ]; then
  echo "tests/prereqs.sh: installing ${packages[*]} (first run only; a few minutes)"
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get update -qq && apt-get install -y -qq "${packages[@]}" >/dev/null; }; then
    echo "tests/prereqs.sh: apt-get install ${packages[*]} failed" >&2
    exit 1
  fi
  case " ${packages[*]} " in *" postgresql "*) installed_pg=1 ;; esac
  packages=()
  missing=()
fi

# -- PostgreSQL on 127.0.0.1:5432, user postgres, no password ------------------------------
pg_answers() { pg_isready -h "$PG_HOST" -p "$PG_PORT" -q >/dev/null 2>&1; }
pg_trusts() {
  psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -w -Atqc 'SELECT 1' >/dev/null 2>&1
}
first_cluster() {  # "VERSION NAME" of the first local cluster, if pg_lsclusters knows one
  have pg_lsclusters && pg_lsclusters -h 2>/dev/null | awk 'NR == 1 { print $1, $2 }'
}

if have psql && have pg_isready; then
  cluster=$(first_cluster)
  if ! pg_answers; then
    if [ "$can_install" = 1 ] && [ -n "$cluster" ]; then
      echo "tests/prereqs.sh: starting PostgreSQL cluster $cluster"
      # shellcheck disable=SC2086  # "VERSION NAME" is two words on purpose
      pg_ctlcluster --skip-systemctl-redirect $cluster start >/dev/null 2>&1 || true
      for _ in $(seq 1 30); do pg_answers && break; sleep 1; done
    fi
    if ! pg_answers; then
      if [ -n "$cluster" ]; then
        missing+=("missing: PostgreSQL answering on $PG_HOST:$PG_PORT; start it with: sudo pg_ctlcluster --skip-systemctl-redirect $cluster start")
      else
        missing+=("missing: PostgreSQL answering on $PG_HOST:$PG_PORT; no local cluster found: create one with: sudo pg_createcluster --start 15 main")
      fi
    fi
  fi
  if pg_answers && ! pg_trusts; then
    hba=""
    [ -n "$cluster" ] && hba="/etc/postgresql/${cluster% *}/${cluster#* }/pg_hba.conf"
    if [ "$installed_pg" = 1 ] && [ -f "$hba" ]; then
      # A server this script just installed for the tests: let user postgres in from
      # loopback without a password, as the suite expects. A server that was already
      # here is the owner's to configure: it is only reported.
      echo "tests/prereqs.sh: trusting user postgres on loopback in $hba (installed for the tests)"
      sed -i '1i host all postgres 127.0.0.1/32 trust\nhost all postgres ::1/128 trust' "$hba"
      # shellcheck disable=SC2086
      pg_ctlcluster --skip-systemctl-redirect $cluster reload >/dev/null 2>&1 || true
      for _ in $(seq 1 10); do pg_trusts && break; sleep 1; done
    fi
    if ! pg_trusts; then
      missing+=("missing: PostgreSQL on $PG_HOST:$PG_PORT lets user postgres in without a password; add 'host all postgres 127.0.0.1/32 trust' at the top of ${hba:-its pg_hba.conf}, then: sudo pg_ctlcluster --skip-systemctl-redirect ${cluster:-VERSION main} reload")
    fi
  fi
fi

if [ ${#missing[@]} -gt 0 ]; then
  printf '%s\n' "${missing[@]}"
  if [ "$mode" = check ]; then
    echo "tests/prereqs.sh: ${#missing[@]} missing; run it as root without --check to install them"
  elif [ "$can_install" = 0 ]; then
    echo "tests/prereqs.sh: ${#missing[@]} missing and this user cannot install them; run the commands above (or 'make test' as root), then 'make test' again"
  fi
  exit 1
fi
exit 0
