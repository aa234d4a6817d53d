#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs what tests/slurm needs (Slurm's daemons and client, munge, spank.h for the plugin, the
# system's Python) where it is missing and this machine allows it: as root, with Debian's
# apt-get. Never fails: where it cannot install, it says why, and tests/slurm skips (or fails,
# under CI=true).
need=""
command -v slurmctld >/dev/null 2>&1 || need="$need slurmctld"
command -v slurmd >/dev/null 2>&1 || need="$need slurmd"
command -v srun >/dev/null 2>&1 || need="$need slurm-client"
command -v munged >/dev/null 2>&1 || need="$need munge"
[ -f /usr/include/slurm/spank.h ] || need="$need libslurm-dev"
# the Python every job's user can run clc from (tests/slurm/install.py)
[ -x /usr/bin/python3 ] || need="$need python3"
[ -z "$need" ] && exit 0
# A machine without a package registry: CLC_SLURM_DEBS names a directory of .deb files (the
# packages above and those of their dependencies this machine lacks, for its release), unpacked
# as they are, without their maintainer scripts, and what those would do done here: the daemons'
# names (Ubuntu's alternatives), munged's socket directory.
if [ -n "$CLC_SLURM_DEBS" ] && [ "$(id -u)" = 0 ]; then
    echo "tests/slurm: unpacking the .deb files of $CLC_SLURM_DEBS"
    for f in "$CLC_SLURM_DEBS"/*.deb; do
        name=$(dpkg-deb -f "$f" Package) || continue
        dpkg -s "$name" 2>/dev/null | grep -q '^Status: install ok installed' && continue
        dpkg-deb --fsys-tarfile "$f" | tar -x -C / --no-overwrite-dir --keep-directory-symlink ||
            echo "tests/slurm: unpacking $f failed"
    done
    for d in slurmctld slurmd slurmstepd; do
        [ -e /usr/sbin/$d ] || [ ! -x /usr/sbin/$d-wlm ] || ln -s $d-wlm /usr/sbin/$d
    done
    mkdir -p /run/munge
    ldconfig
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/slurm: missing$need, and this machine cannot install them (not root, or no apt-get)"
    exit 0
fi
echo "tests/slurm: installing$need"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! apt-get install -y -q --no-install-recommends $need >"$log" 2>&1; then
    apt-get update -q >>"$log" 2>&1
    apt-get install -y -q --no-install-recommends $need >>"$log" 2>&1 ||
        { echo "tests/slurm: apt-get install$need failed:"; tail -5 "$log"; }
fi
rm -f "$log"
exit 0
