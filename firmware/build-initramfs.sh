#!/usr/bin/env bash
# Builds the guest initramfs: busybox, the kernel modules the guest needs,
# the guest agent and the guest tools (linked statically), and a glibc
# runtime so that programs built on the host with plain gcc run in guests:
#   - the dynamic loader and the libraries the host toolchain links against
#     (libc, libm, libpthread/libdl/librt/libutil stubs, libresolv, libgcc_s,
#     libstdc++), copied from the host's installed Debian packages into
#     /lib/<multiarch> (the host is Debian bookworm, like the guest's kernel);
#   - libimc.so, libump.so, libdd.so, libbbp.so, libmpi_abi.so.1, libpvm3.so.3 and libgpvm3.so.3
#     (host builds, target/release)
#     in /usr/local/lib,
#     found through /etc/ld.so.conf and the ld.so.cache built here.
#
# Usage: firmware/build-initramfs.sh CACHE_DIR
# Needs: CACHE_DIR/kernel (from scripts/setup.sh), busybox-static, cpio, kmod,
# the guest binaries in target/guest/x86_64-unknown-linux-gnu/release and
# libimc.so, libump.so, libdd.so, libbbp.so, libmpi_abi.so.1, libpvm3.so.3, libgpvm3.so.3 in target/release.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${1:?usage: build-initramfs.sh CACHE_DIR}
KDIR=$CACHE/kernel
KVER=$(cat "$KDIR/version" 2>/dev/null) || { echo "no kernel in $KDIR: run scripts/setup.sh" >&2; exit 1; }
GUEST_BIN=$REPO/target/guest/x86_64-unknown-linux-gnu/release
BINS=(mc-agent mctool imcd imc-bench ump-tool dd-tool bbp-tool figure6 mpid mpiexec pvmd)
SO_DIR=$REPO/target/release
MODULES=(virtio_pci virtio_console vfio_pci vfio_iommu_type1 virtio_net 9pnet_virtio 9p)
# glibc runtime: required, then taken when the host has them.
RUNTIME_REQUIRED=(libc.so.6 libm.so.6 libgcc_s.so.1)
RUNTIME_OPTIONAL=(libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 libresolv.so.2 libstdc++.so.6 libatomic.so.1)
GUEST_LIBS=(libimc.so libump.so libdd.so libbbp.so libmpi_abi.so.1 libpvm3.so.3 libgpvm3.so.3)
BUSYBOX=$(command -v busybox || true)
[ -x /bin/busybox ] && BUSYBOX=/bin/busybox
[ -n "$BUSYBOX" ] || { echo "busybox not found: apt-get install busybox-static" >&2; exit 1; }
ldd "$BUSYBOX" >/dev/null 2>&1 && { echo "$BUSYBOX is dynamically linked: install busybox-static" >&2; exit 1; }

ROOT=$CACHE/initramfs-root
rm -rf "$ROOT"
mkdir -p "$ROOT"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,usr/bin,usr/sbin,lib/modules}
cp "$BUSYBOX" "$ROOT/bin/busybox"
for applet in $("$BUSYBOX" --list); do
    [ -e "$ROOT/bin/$applet" ] || ln -s busybox "$ROOT/bin/$applet"
done
ln -sf bin/busybox "$ROOT/init"
cp -r "$HERE/rootfs/." "$ROOT/"
for b in "${BINS[@]}"; do
    [ -x "$GUEST_BIN/$b" ] || { echo "guest binary $GUEST_BIN/$b missing: run scripts/setup.sh" >&2; exit 1; }
    # Without the debug info the release profile keeps: the image unpacks
    # into the guest's RAM (half of it at most), and with line tables the
    # binaries alone fill most of that.
    strip --strip-debug -o "$ROOT/bin/$b" "$GUEST_BIN/$b"
done
# mpirun is mpiexec under its other name.
ln -sf mpiexec "$ROOT/bin/mpirun"

# glibc runtime from the host's packages.
MA=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
LDSO=/lib64/ld-linux-x86-64.so.2
[ -e "$LDSO" ] || { echo "$LDSO not found: is this an x86-64 glibc host?" >&2; exit 1; }
mkdir -p "$ROOT/lib/$MA" "$ROOT/lib64" "$ROOT/usr/local/lib"
cp -L "$LDSO" "$ROOT/lib/$MA/ld-linux-x86-64.so.2"
ln -sf "/lib/$MA/ld-linux-x86-64.so.2" "$ROOT$LDSO"
find_lib() { # soname -> host path, or nothing
    local d
    for d in "/lib/$MA" "/usr/lib/$MA" /lib /usr/lib; do
        [ -e "$d/$1" ] && { echo "$d/$1"; return; }
    done
}
nlibs=0
add_lib() { # soname [required]
    local p
    [ -e "$ROOT/lib/$MA/$1" ] && return 0
    p=$(find_lib "$1")
    if [ -z "$p" ]; then
        [ "${2:-}" = required ] && { echo "$1 not found on the host (libc6, libgcc-s1)" >&2; exit 1; }
        return 0
    fi
    cp -L "$p" "$ROOT/lib/$MA/$1"
    nlibs=$((nlibs + 1))
}
for l in "${RUNTIME_REQUIRED[@]}"; do add_lib "$l" required; done
for l in "${RUNTIME_OPTIONAL[@]}"; do add_lib "$l"; done
for l in "${GUEST_LIBS[@]}"; do
    [ -f "$SO_DIR/$l" ] || { echo "$SO_DIR/$l missing: run scripts/setup.sh" >&2; exit 1; }
    # Without the debug info the release profile keeps (a few MiB each).
    strip --strip-debug -o "$ROOT/usr/local/lib/$l" "$SO_DIR/$l"
done
# Whatever those need in turn (as the host's loader resolves it).
for f in "$ROOT/lib/$MA"/*.so* "$ROOT/usr/local/lib"/*.so; do
    for dep in $(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1 }'); do
        add_lib "$dep" required
    done
done
echo /usr/local/lib >"$ROOT/etc/ld.so.conf"
ldconfig -r "$ROOT" || { echo "ldconfig -r $ROOT failed" >&2; exit 1; }

# Kernel modules with their dependencies, from depmod's view of the package.
MODROOT=$KDIR/pkg
[ -f "$MODROOT/lib/modules/$KVER/modules.dep" ] || depmod -b "$MODROOT" "$KVER"
declare -A want=()
resolve() { # module name -> paths (relative to lib/modules/KVER), deps first
    local name=${1//-/_} line path
    line=$(awk -v n="$name" -F: '{ f=$1; sub(/.*\//, "", f); sub(/\.ko(\..*)?$/, "", f); gsub(/-/, "_", f); if (f == n) { print; exit } }' "$MODROOT/lib/modules/$KVER/modules.dep")
    if [ -z "$line" ]; then
        grep -q "/${1}.ko" "$MODROOT/lib/modules/$KVER/modules.builtin" 2>/dev/null && return 0
        echo "kernel module $1 not found in $KVER" >&2; exit 1
    fi
    path=${line%%:*}
    for d in ${line#*:}; do want[$d]=1; done
    want[$path]=1
}
for m in "${MODULES[@]}"; do resolve "$m"; done
for p in "${!want[@]}"; do
    mkdir -p "$ROOT/lib/modules/$KVER/$(dirname "$p")"
    cp "$MODROOT/lib/modules/$KVER/$p" "$ROOT/lib/modules/$KVER/$p"
done
cp "$MODROOT/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$ROOT/lib/modules/$KVER/" 2>/dev/null || true
depmod -b "$ROOT" "$KVER"

# Uncompressed: under TCG the guest kernel inflates a gzipped image in about
# 1.8 s and copies this one in 0.6 s (docs/benchmarks.md, "Boot time").
OUT=$CACHE/initramfs.cpio
(cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet) >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "initramfs: $OUT ($(du -h "$OUT" | cut -f1), ${#want[@]} modules, $nlibs runtime libraries, kernel $KVER)"
