#!/usr/bin/env bash
# Installs everything the virtual cluster needs on a Debian bookworm machine
# and builds what Debian does not ship:
#   - Debian packages (build deps, firmware, busybox, kernel tools)
#   - a QEMU >= 10.1 with vfio-user-pci and virtio-9p (the shared folder):
#     the system one if it has both, else built from Debian's source package
#     into the cache
#   - the guest kernel and modules (Debian's linux-image-*-amd64-unsigned)
#   - the host tools (mc-hub, mc-adapter, mc-cluster), the MPI library
#     (libmpi_abi.so.1) and the guest initramfs
#   - MPICH's PyPI wheel (mpich==5.0.2) in $MC_CACHE/mpich: its mpi_abi.h is
#     the reference the MPI ABI test compares our mpi.h with
#   - MPICH's test suite and examples (test/mpi, examples) from Debian's
#     mpich source package in $MC_CACHE/mpich-src (step mpich-suite)
#   - NetPIPE's source (Debian's netpipe) in $MC_CACHE/netpipe-src, for the
#     MPI benchmark (step netpipe)
#   - the PVM library (libpvm3.so.3, step rust) and Debian's PVM 3.4.6
#     packages unpacked in $MC_CACHE/pvm/root (step pvm): the example
#     programs it must run unchanged, pvm-dev's pvm3.h, the real PVM
#     as the peer
#
# Idempotent: every step checks its own result and skips work already done.
# Cache folder: $MC_CACHE (default: <repo>/.cache, ignored by git).
#
# Optional step "fuzz" (not in the default list): cargo-fuzz into
# $MC_CACHE/cargo-fuzz for scripts/fuzz.sh (needs a C++ compiler, which
# build-essential brings).
# Optional step "lint" (not in the default list; scripts/test.sh runs it):
# cargo-machete into $MC_CACHE/cargo-machete, which finds dependencies a
# crate declares and never uses.
#
#   - playwright-core (npm, pinned) in $MC_CACHE/playwright: drives
#     Debian's chromium in the monitor's browser test (step browser)
#
# Usage: scripts/setup.sh [--no-apt] [--only "apt qemu kernel rust mpich mpich-suite netpipe pvm image browser fuzz lint"]
#   --no-apt     skip the apt step (packages already in place; no root needed)
#   --only LIST  run just these steps, in this order
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/usage.sh"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MC_CACHE=${MC_CACHE:-$REPO/.cache}
NO_APT=0
ONLY=""
while [ $# -gt 0 ]; do
    arg=$1; shift
    case "$arg" in
        --no-apt) NO_APT=1 ;;
        --only) ONLY="${1:?--only needs a list of steps}"; shift ;;
        -h|--help) usage_text; exit 0 ;;
        *) echo "setup: unknown option '$arg' (try --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$MC_CACHE"
export DEBIAN_FRONTEND=noninteractive

T0=$(date +%s)
step() { printf '\n==> [%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (run as root or with sudo)"; }

# ---------------------------------------------------------------- apt -------
APT_LIST=/etc/apt/sources.list.d/mc-cluster.sources
APT_PKGS=(
    # QEMU build dependencies (a minimal configure: x86_64 system emulation, vfio-user, virtfs)
    build-essential ninja-build pkg-config libglib2.0-dev libpixman-1-dev
    libslirp-dev libfdt-dev flex bison device-tree-compiler python3-venv
    dpkg-dev
    # guest image
    busybox-static cpio xz-utils zstd kmod
    # the guests' LAN (tap on a bridge in a network namespace: launcher/src/lan.rs)
    iproute2
    # QEMU firmware at run time
    seabios ipxe-qemu
    # the Wireshark dissector's tests (hub/wireshark/mc.lua, tests/tests/wireshark.rs)
    tshark
    # the monitor's browser test (tests/tests/monitor_qemu.rs, step browser)
    chromium
)
setup_apt() {
    if [ "$NO_APT" = 1 ]; then step "apt: skipped (--no-apt)"; return; fi
    need_root "installing Debian packages"
    # Source suites: sid for the newest QEMU and MPICH; bookworm as the
    # fallback when sid lists a version whose files are gone. A list written
    # before bookworm's sources were added is written again.
    if [ ! -f "$APT_LIST" ] || ! grep -q '^Suites: sid bookworm$' "$APT_LIST"; then
        step "apt: adding bookworm-backports (binaries) and sid and bookworm (sources only)"
        cat >"$APT_LIST" <<'EOF'
# Added by mc-cluster scripts/setup.sh
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        rm -f "$MC_CACHE/.apt-updated"
    fi
    if [ ! -f "$MC_CACHE/.apt-updated" ] || [ -n "$(find "$MC_CACHE/.apt-updated" -mmin +1440 2>/dev/null)" ]; then
        step "apt: updating package lists"
        apt-get update -q >"$MC_CACHE/apt-update.log" 2>&1 || { tail -20 "$MC_CACHE/apt-update.log"; die "apt-get update failed (see $MC_CACHE/apt-update.log)"; }
        touch "$MC_CACHE/.apt-updated"
    fi
    local missing=()
    for p in "${APT_PKGS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        step "apt: installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >"$MC_CACHE/apt-install.log" 2>&1 \
            || { tail -20 "$MC_CACHE/apt-install.log"; die "apt-get install failed (see $MC_CACHE/apt-install.log)"; }
    else
        step "apt: all packages present"
    fi
    # QEMU's data files (option ROMs, keymaps): the backports package matches
    # QEMU 10.x; bookworm's own is 7.2.
    if ! dpkg-query -W -f='${Version}' qemu-system-data 2>/dev/null | grep -q '^1:1[0-9]'; then
        step "apt: installing qemu-system-data from bookworm-backports"
        apt-get install -y -q --no-install-recommends -t bookworm-backports qemu-system-data >>"$MC_CACHE/apt-install.log" 2>&1 \
            || die "could not install qemu-system-data from bookworm-backports (see $MC_CACHE/apt-install.log)"
    fi
}

# ---------------------------------------------------------------- QEMU ------
QEMU_MIN=10.1
qemu_ok() { # $1 = binary; true when >= QEMU_MIN and it has vfio-user-pci and virtio-9p-pci
    local bin=$1 v
    [ -x "$bin" ] || return 1
    v=$("$bin" --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p')
    [ -n "$v" ] || return 1
    dpkg --compare-versions "$v" ge "$QEMU_MIN" || return 1
    local devs
    devs=$("$bin" -device help 2>/dev/null)
    grep -q '"vfio-user-pci"' <<<"$devs" && grep -q '"virtio-9p-pci"' <<<"$devs"
}
setup_qemu() {
    local sys
    sys=$(command -v qemu-system-x86_64 || true)
    if [ -n "$sys" ] && qemu_ok "$sys"; then
        step "qemu: using system $sys ($("$sys" --version | head -1))"
        ln -sfn "$sys" "$MC_CACHE/qemu-system-x86_64"
        return
    fi
    if [ -L "$MC_CACHE/qemu-system-x86_64" ] && qemu_ok "$MC_CACHE/qemu-system-x86_64"; then
        step "qemu: cached $(readlink "$MC_CACHE/qemu-system-x86_64")"
        return
    fi
    step "qemu: no QEMU >= $QEMU_MIN with vfio-user-pci and virtio-9p on this system; building one from Debian's source package"
    command -v apt-get >/dev/null || die "apt-get not found: install QEMU >= $QEMU_MIN by hand and put qemu-system-x86_64 on PATH"
    # Candidate source versions >= QEMU_MIN, newest first. The archive can
    # list a version whose files are already gone, so fall back in order.
    local ver candidates=() best="" src="" upstream=""
    for ver in $(apt-cache showsrc qemu 2>/dev/null | sed -n 's/^Version: //p' | sort -u); do
        dpkg --compare-versions "${ver#*:}" ge "$QEMU_MIN" && candidates+=("$ver")
    done
    [ ${#candidates[@]} -gt 0 ] || die "no qemu source package >= $QEMU_MIN in the configured deb-src suites (check $APT_LIST and run apt-get update)"
    mapfile -t candidates < <(printf '%s\n' "${candidates[@]}" | sort -rV)
    # a source already fetched into the cache wins
    for ver in "${candidates[@]}"; do
        upstream=${ver#*:}; upstream=${upstream%%+*}; upstream=${upstream%%-*}
        if [ -f "$MC_CACHE/qemu-src/$upstream/.fetched" ]; then best=$ver; break; fi
    done
    if [ -z "$best" ]; then
        for ver in "${candidates[@]}"; do
            upstream=${ver#*:}; upstream=${upstream%%+*}; upstream=${upstream%%-*}
            src=$MC_CACHE/qemu-src/$upstream
            step "qemu: fetching source package qemu=$ver"
            rm -rf "$src"; mkdir -p "$src"
            if (cd "$src" && apt-get source -q --download-only "qemu=$ver" >"$MC_CACHE/qemu-fetch.log" 2>&1); then
                local orig
                orig=$(ls "$src"/qemu_*.orig.tar.* | head -1)
                step "qemu: unpacking $(basename "$orig")"
                tar -C "$src" -xf "$orig"
                rm -f "$src"/*.tar.* "$src"/*.dsc
                touch "$src/.fetched"
                best=$ver
                break
            fi
            echo "    qemu=$ver could not be fetched (not in the archive any more); trying an older one"
            rm -rf "$src"
        done
    fi
    [ -n "$best" ] || die "none of the qemu source packages (${candidates[*]}) could be fetched (see $MC_CACHE/qemu-fetch.log)"
    upstream=${best#*:}; upstream=${upstream%%+*}; upstream=${upstream%%-*}
    src=$MC_CACHE/qemu-src/$upstream
    local build=$MC_CACHE/qemu-build/$upstream
    step "qemu: using source qemu=$best (upstream $upstream)"
    local tree
    tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name 'qemu*' | head -1)
    [ -n "$tree" ] || die "unpacked qemu source not found under $src"
    # The +ds tarball ships no firmware blobs: never try to unpack edk2.
    sed -i 's/^if unpack_edk2_blobs$/if false # mc-cluster: +ds tarball has no edk2 blobs/' "$tree/pc-bios/meson.build"
    # meson from PyPI (QEMU 10.x needs a newer one than bookworm has)
    local venv=$MC_CACHE/venv
    if [ ! -x "$venv/bin/meson" ]; then
        step "qemu: installing meson 1.9 from PyPI into $venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q 'meson>=1.9,<1.10' 'pycotap>=1.1.0' || die "pip install meson failed"
    fi
    mkdir -p "$build"
    # A build configured before the shared folder existed has no virtfs:
    # configure again. --enable-virtfs fails loudly if its build deps are
    # missing (QEMU 10 needs only glibc's xattr calls, which libc6-dev has).
    if [ ! -f "$build/build.ninja" ] || ! grep -Eq 'VirtFS \(9P\) support +: YES' "$build/configure.log" 2>/dev/null; then
        step "qemu: configure (log: $build/configure.log)"
        (cd "$build" && PATH="$venv/bin:$PATH" "$tree/configure" \
            --target-list=x86_64-softmmu --disable-download --disable-install-blobs --enable-virtfs \
            --python="$venv/bin/python3" --disable-docs --disable-werror \
            --disable-gtk --disable-sdl --disable-vnc --disable-opengl --disable-spice \
            >"$build/configure.log" 2>&1) || { tail -30 "$build/configure.log"; die "QEMU configure failed"; }
    fi
    step "qemu: ninja (about 4 to 5 minutes on 2 cores; log: $build/ninja.log)"
    (cd "$build" && PATH="$venv/bin:$PATH" ninja qemu-system-x86_64 >"$build/ninja.log" 2>&1) \
        || { tail -30 "$build/ninja.log"; die "QEMU build failed"; }
    qemu_ok "$build/qemu-system-x86_64" || die "built QEMU at $build has no vfio-user-pci or no virtio-9p-pci"
    ln -sfn "$build/qemu-system-x86_64" "$MC_CACHE/qemu-system-x86_64"
    step "qemu: built $("$build/qemu-system-x86_64" --version | head -1)"
}

# ---------------------------------------------------------------- kernel ----
setup_kernel() {
    local kdir=$MC_CACHE/kernel
    if [ -f "$kdir/.done" ] && [ -f "$kdir/vmlinuz" ]; then
        step "kernel: cached $(cat "$kdir/.done")"
        unpack_vmlinux "$kdir"
        return
    fi
    local pkg
    # Debian's generic kernel (not -rt or -cloud, not backports): its modules (vfio, 9p, virtio) are what the image loads
    pkg=$(apt-cache search --names-only '^linux-image-[0-9.]+-[0-9]+-amd64-unsigned$' 2>/dev/null \
        | awk '{print $1}' | sort -V | tail -1)
    [ -n "$pkg" ] || die "no linux-image-*-amd64-unsigned package found (run apt-get update)"
    step "kernel: fetching $pkg"
    rm -rf "$kdir"; mkdir -p "$kdir/pkg"
    (cd "$kdir" && apt-get download -q "$pkg" >"$MC_CACHE/kernel-fetch.log" 2>&1) \
        || { tail "$MC_CACHE/kernel-fetch.log"; die "apt-get download $pkg failed"; }
    dpkg-deb -x "$kdir"/"$pkg"_*.deb "$kdir/pkg"
    rm -f "$kdir"/*.deb
    local vmlinuz
    vmlinuz=$(ls "$kdir"/pkg/boot/vmlinuz-* | head -1)
    cp "$vmlinuz" "$kdir/vmlinuz"
    basename "$vmlinuz" | sed 's/^vmlinuz-//' >"$kdir/version"
    echo "$pkg" >"$kdir/.done"
    unpack_vmlinux "$kdir"
}

# The kernel uncompressed ($kdir/vmlinux), which QEMU boots through its PVH
# entry point: under TCG the bzImage's own XZ decompression took 5-6 s of
# every guest's boot (a guest's init ran at 5.9-7.9 s instead of 11.3-13.8 s
# from QEMU's start). mc-cluster uses it when it is there; without the PVH
# note (or on any failure here) it boots vmlinuz as before.
unpack_vmlinux() {
    local kdir=$1 off
    [ -f "$kdir/vmlinux" ] && return
    off=$(LC_ALL=C grep -obUaP -m1 '\xfd7zXZ\x00' "$kdir/vmlinuz" | head -1 | cut -d: -f1)
    if [ -z "$off" ]; then
        step "kernel: vmlinuz is not XZ-compressed; booting it as it is"
        return
    fi
    tail -c +$((off + 1)) "$kdir/vmlinuz" | xz -dc --single-stream >"$kdir/vmlinux.tmp" 2>/dev/null || true
    # ELF, with the Xen ELF note 18 (XEN_ELFNOTE_PHYS32_ENTRY): QEMU's PVH boot.
    if [ "$(head -c 4 "$kdir/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ] \
        && readelf -n "$kdir/vmlinux.tmp" 2>/dev/null | grep -qiE '0x00000012|PHYS32_ENTRY'; then
        mv "$kdir/vmlinux.tmp" "$kdir/vmlinux"
        step "kernel: unpacked vmlinux ($(( $(stat -c %s "$kdir/vmlinux") >> 20 )) MiB, PVH entry) for a faster boot"
    else
        rm -f "$kdir/vmlinux.tmp"
        step "kernel: no PVH entry in the unpacked kernel; booting vmlinuz"
    fi
}

# ---------------------------------------------------------------- rust ------
setup_rust() {
    command -v cargo >/dev/null || die "cargo not found: install Rust (rustup) first"
    # The test command's lint step needs rustfmt and clippy.
    if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
        command -v rustup >/dev/null && rustup component add rustfmt clippy >/dev/null 2>&1
        cargo fmt --version >/dev/null 2>&1 || die "rustfmt is missing (rustup component add rustfmt)"
        cargo clippy --version >/dev/null 2>&1 || die "clippy is missing (rustup component add clippy)"
    fi
    step "rust: building host tools (mc-hub, mc-adapter, mc-cluster) and libimc.so"
    (cd "$REPO" && cargo build --release -q --bins && cargo build --release -q -p libimc -p ump -p dd -p bbp) \
        || die "cargo build failed"
    step "rust: building static guest binaries (mc-agent, mctool, imcd, ump-tool, dd-tool, bbp-tool, mpid, mpiexec, pvmd, libimc.a, libump.a, libdd.a, libbbp.a)"
    (cd "$REPO" && RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --release -q --target x86_64-unknown-linux-gnu \
        --target-dir "$REPO/target/guest" -p agent -p imcd -p mctool -p libimc -p ump -p ump-tool -p dd -p dd-tool -p bbp -p bbp-tool -p mpiexec -p pvm 2>&1 \
        | grep -v "dropping unsupported crate type .cdylib.") ; [ "${PIPESTATUS[0]}" = 0 ] || die "guest build failed"
    step "c: installing libimc, libump, libdd and libbbp (target/guest/c) and building the C programs (figure6, ...)"
    local gbin="$REPO/target/guest/x86_64-unknown-linux-gnu/release"
    "$REPO/scripts/build-c.sh" "$gbin" "$REPO/target/release" "$REPO/target/guest/c" "$gbin" \
        || die "building the C programs failed"
    step "rust: linking the MPI library (target/release/libmpi_abi.so.1)"
    "$REPO/scripts/build-mpi.sh" || die "building libmpi_abi.so.1 failed"
    step "rust: linking the PVM library (target/release/libpvm3.so.3, libgpvm3.so.3)"
    "$REPO/scripts/build-pvm.sh" || die "building libpvm3.so.3 failed"
}

# ---------------------------------------------------------------- mpich -----
MPICH_VERSION=5.0.2
setup_mpich() {
    local dir=$MC_CACHE/mpich
    if [ -f "$dir/.done" ] && [ "$(cat "$dir/.done")" = "$MPICH_VERSION" ] && [ -f "$dir/include/mpi_abi.h" ]; then
        step "mpich: wheel $MPICH_VERSION cached ($dir)"
        return
    fi
    local venv=$MC_CACHE/venv
    if [ ! -x "$venv/bin/pip" ]; then
        step "mpich: creating a Python venv for pip in $venv"
        python3 -m venv "$venv" || die "python3 -m venv failed (apt-get install python3-venv)"
    fi
    step "mpich: installing the PyPI wheel mpich==$MPICH_VERSION into $dir (about 13 MB)"
    rm -rf "$dir"
    "$venv/bin/pip" install -q --no-deps --prefix "$dir" "mpich==$MPICH_VERSION" >"$MC_CACHE/mpich-install.log" 2>&1 \
        || { tail -20 "$MC_CACHE/mpich-install.log"; die "pip install mpich==$MPICH_VERSION failed (see $MC_CACHE/mpich-install.log)"; }
    [ -f "$dir/include/mpi_abi.h" ] || die "the mpich wheel has no include/mpi_abi.h"
    echo "$MPICH_VERSION" >"$dir/.done"
}

# ------------------------------------------------------ source packages -----
# fetch_orig STEP PKG [apt-get source options...]: downloads the newest
# version of Debian source package PKG whose files can still be fetched
# (sid can list one that is already gone) into $MC_CACHE/PKG-src.tmp; sets
# ORIG (its upstream tarball) and ORIG_VER (the version, without epoch).
fetch_orig() {
    local stepname=$1 pkg=$2 ver candidates=() tmp log
    shift 2
    command -v apt-get >/dev/null || die "apt-get not found: $stepname needs Debian's $pkg source package"
    mapfile -t candidates < <(apt-cache showsrc "$pkg" 2>/dev/null | sed -n 's/^Version: //p' | sort -u | sort -rV)
    [ ${#candidates[@]} -gt 0 ] || die "no $pkg source package in the configured deb-src suites (run the apt step: scripts/setup.sh --only apt)"
    tmp=$MC_CACHE/$pkg-src.tmp
    log=$MC_CACHE/$pkg-src-fetch.log
    for ver in "${candidates[@]}"; do
        step "$stepname: fetching source package $pkg=$ver"
        rm -rf "$tmp"; mkdir -p "$tmp"
        if (cd "$tmp" && apt-get source -q --download-only "$@" "$pkg=$ver" >"$log" 2>&1); then
            ORIG=$(ls "$tmp/${pkg}_"*.orig.tar.* 2>/dev/null | head -1)
            [ -n "$ORIG" ] || die "$pkg=$ver fetched but it has no orig tarball (see $log)"
            ORIG_VER=${ver#*:}
            return
        fi
        echo "    $pkg=$ver could not be fetched (not in the archive any more); trying an older one"
    done
    rm -rf "$tmp"
    die "none of the $pkg source packages (${candidates[*]}) could be fetched (see $log)"
}

# ---------------------------------------------------------------- mpich-suite
# MPICH's own test suite (test/mpi) and example programs (examples) from
# Debian's mpich source package, unpacked into $MC_CACHE/mpich-src for
# tests/src/bin/mpi-suite.rs and the examples test. Only those two folders
# are kept. Like QEMU's source: the newest version whose files can still be
# fetched (bookworm has 4.0.2).
setup_mpich_suite() {
    local dir=$MC_CACHE/mpich-src
    if [ -f "$dir/.done" ] && [ -f "$dir/test/mpi/util/mtest.c" ] && [ -f "$dir/examples/cpi.c" ]; then
        step "mpich-suite: MPICH $(cat "$dir/.done") test/mpi and examples cached ($dir)"
        return
    fi
    fetch_orig mpich-suite mpich
    step "mpich-suite: unpacking test/mpi and examples from $(basename "$ORIG")"
    rm -rf "$dir"; mkdir -p "$dir"
    tar -C "$dir" --strip-components=1 --wildcards --no-wildcards-match-slash -xf "$ORIG" 'mpich-*/test/mpi' 'mpich-*/examples' \
        || die "unpacking $ORIG failed"
    [ -f "$dir/test/mpi/util/mtest.c" ] || die "$ORIG has no test/mpi/util/mtest.c"
    rm -rf "$MC_CACHE/mpich-src.tmp"
    echo "$ORIG_VER" >"$dir/.done"
}

# ------------------------------------------------------------- netpipe -----
# NetPIPE 3.7.2 (Debian source package netpipe) for the MPI benchmark
# (scripts/mpi-bench.sh): its upstream tarball only; Debian's patch tarball
# can no longer be fetched, and --tar-only does not ask for it. The
# benchmark builds NPtcp and NPmpi from $MC_CACHE/netpipe-src.
setup_netpipe() {
    local dir=$MC_CACHE/netpipe-src
    if [ -f "$dir/.done" ] && [ -f "$dir/src/netpipe.c" ] && [ -f "$dir/src/mpi.c" ]; then
        step "netpipe: NetPIPE $(cat "$dir/.done") source cached ($dir)"
        return
    fi
    fetch_orig netpipe netpipe --tar-only
    rm -rf "$dir"; mkdir -p "$dir"
    tar -C "$dir" --strip-components=1 -xf "$ORIG" || die "unpacking $ORIG failed"
    [ -f "$dir/src/netpipe.c" ] || die "$ORIG has no src/netpipe.c"
    rm -rf "$MC_CACHE/netpipe-src.tmp"
    echo "$ORIG_VER" >"$dir/.done"
}

# ------------------------------------------------------------------ pvm -----
# Debian bookworm's PVM 3.4.6 binary packages, unpacked (never installed)
# in $MC_CACHE/pvm/root: the example programs our libpvm3.so.3 must run
# unchanged, pvm-dev's pvm3.h for the header check, and the real PVM
# (pvmd, its libpvm3.so.3, and libtirpc3 with the Kerberos libraries it
# needs, which the guests lack) as the peer.
PVM_DEBS="libpvm3 pvm pvm-dev pvm-examples libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1"
setup_pvm() {
    local dir=$MC_CACHE/pvm
    if [ -f "$dir/.done" ] && [ -f "$dir/root/usr/include/pvm3.h" ] && [ -x "$dir/root/usr/bin/master1" ] \
        && [ -e "$dir/root/usr/lib/x86_64-linux-gnu/libkrb5.so.3" ]; then
        step "pvm: Debian's PVM $(cat "$dir/.done") cached ($dir/root)"
        return
    fi
    step "pvm: fetching Debian's $PVM_DEBS"
    rm -rf "$dir.tmp"; mkdir -p "$dir.tmp/debs"
    (cd "$dir.tmp/debs" && apt-get download -q $PVM_DEBS >"$MC_CACHE/pvm-fetch.log" 2>&1) \
        || { tail "$MC_CACHE/pvm-fetch.log"; die "apt-get download $PVM_DEBS failed"; }
    local d
    for d in "$dir.tmp"/debs/*.deb; do dpkg -x "$d" "$dir.tmp/root" || die "unpacking $d failed"; done
    [ -f "$dir.tmp/root/usr/include/pvm3.h" ] || die "pvm-dev has no /usr/include/pvm3.h"
    rm -rf "$dir"; mv "$dir.tmp" "$dir"
    dpkg-deb -f "$dir"/debs/libpvm3_*.deb Version >"$dir/.done"
}

# ---------------------------------------------------------------- image -----
setup_image() {
    step "image: building the guest initramfs"
    "$REPO/firmware/build-initramfs.sh" "$MC_CACHE" || die "initramfs build failed"
}

# ------------------------------------------------------- cargo tools ------
# cargo_tool_cached STEP NAME VERSION: true (and says so) when NAME VERSION
# is installed in $MC_CACHE/NAME already.
cargo_tool_cached() {
    local bin="$MC_CACHE/$2/bin/$2"
    [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -qF "$3" || return 1
    step "$1: $2 $3 cached ($bin)"
}

# cargo_tool_install STEP NAME VERSION [NOTE] [CARGO-INSTALL-FLAGS...]:
# cargo install NAME VERSION into $MC_CACHE/NAME, its output in
# $MC_CACHE/NAME-install.log.
cargo_tool_install() {
    command -v cargo >/dev/null || die "cargo not found: install Rust (rustup) first"
    step "$1: installing $2 $3 into $MC_CACHE/$2${4:-}"
    cargo install -q --locked "${@:5}" --version "$3" --root "$MC_CACHE/$2" "$2" >"$MC_CACHE/$2-install.log" 2>&1 \
        || { tail -20 "$MC_CACHE/$2-install.log"; die "cargo install $2 failed (see $MC_CACHE/$2-install.log)"; }
}

# ---------------------------------------------------------------- fuzz ------
CARGO_FUZZ_VERSION=0.13.2
setup_fuzz() {
    cargo_tool_cached fuzz cargo-fuzz "$CARGO_FUZZ_VERSION" && return
    # libfuzzer-sys compiles libFuzzer from its C++ source.
    command -v c++ >/dev/null || die "no C++ compiler (c++): install build-essential (step apt)"
    cargo_tool_install fuzz cargo-fuzz "$CARGO_FUZZ_VERSION"
}

# ---------------------------------------------------------------- browser ---
# playwright-core only (no browser download: the test points it at
# Debian's /usr/bin/chromium). 1.49 is the newest that runs on bookworm's
# Node 18.
PLAYWRIGHT_VERSION=1.49.1
setup_browser() {
    local dir=$MC_CACHE/playwright
    if [ -f "$dir/node_modules/playwright-core/package.json" ] \
        && grep -q "\"version\": \"$PLAYWRIGHT_VERSION\"" "$dir/node_modules/playwright-core/package.json"; then
        step "browser: playwright-core $PLAYWRIGHT_VERSION present"
        return
    fi
    if ! command -v npm >/dev/null; then
        [ "$NO_APT" = 1 ] && die "browser: npm is missing (install nodejs and npm, or run without --no-apt)"
        need_root "installing nodejs and npm"
        step "browser: installing nodejs and npm"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm >>"$MC_CACHE/apt-install.log" 2>&1 \
            || die "apt-get install nodejs npm failed (see $MC_CACHE/apt-install.log)"
    fi
    step "browser: playwright-core $PLAYWRIGHT_VERSION (npm) into $dir"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --no-save "playwright-core@$PLAYWRIGHT_VERSION" >"$MC_CACHE/playwright.log" 2>&1 \
        || { tail -20 "$MC_CACHE/playwright.log"; die "npm install playwright-core failed (see $MC_CACHE/playwright.log)"; }
}

# ---------------------------------------------------------------- lint ------
CARGO_MACHETE_VERSION=0.9.2
setup_lint() {
    cargo_tool_cached lint cargo-machete "$CARGO_MACHETE_VERSION" && return
    # A debug build: it installs in under a minute instead of three and a
    # half (2 cores), and still checks this workspace in seconds.
    cargo_tool_install lint cargo-machete "$CARGO_MACHETE_VERSION" " (about a minute, once)" --debug
}

for s in ${ONLY:-apt qemu kernel rust mpich mpich-suite netpipe pvm image browser}; do
    case "$s" in
        apt|qemu|kernel|rust|mpich|netpipe|pvm|image|browser|fuzz|lint) "setup_$s" ;;
        mpich-suite) setup_mpich_suite ;;
        *) die "unknown step '$s' (steps: apt qemu kernel rust mpich mpich-suite netpipe pvm image browser fuzz lint)" ;;
    esac
done
step "setup complete (cache: $MC_CACHE)"
