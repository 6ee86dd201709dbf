#!/usr/bin/env bash
# Builds the guest initramfs: busybox, the kernel modules the guest needs,
# the guest agent and the guest tools (linked statically).
#
# Usage: firmware/build-initramfs.sh CACHE_DIR
# Needs: CACHE_DIR/kernel (from scripts/setup.sh), busybox-static, cpio, kmod,
# and the guest binaries in target/guest/x86_64-unknown-linux-gnu/release.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${1:?usage: build-initramfs.sh CACHE_DIR}
KDIR=$CACHE/kernel
KVER=$(cat "$KDIR/version" 2>/dev/null) || { echo "no kernel in $KDIR: run scripts/setup.sh" >&2; exit 1; }
GUEST_BIN=$REPO/target/guest/x86_64-unknown-linux-gnu/release
BINS=(mc-agent mctool imcd imc-bench ump-tool figure6)
MODULES=(virtio_pci virtio_console vfio_pci vfio_iommu_type1 virtio_net)
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
    cp "$GUEST_BIN/$b" "$ROOT/bin/$b"
done

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

OUT=$CACHE/initramfs.cpio.gz
(cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "initramfs: $OUT ($(du -h "$OUT" | cut -f1), ${#want[@]} modules, kernel $KVER)"
