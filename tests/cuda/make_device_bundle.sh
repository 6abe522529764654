#!/usr/bin/env bash
# Packs the Debian packages this project's CMake configuration needs (headers,
# CMake/pkg-config files, libraries) into .gpu-deps/ at the repository root,
# for a GPU machine that has CUDA, CMake and a compiler but none of them.
# Run here (Debian 12, packages installed by scripts/setup.sh); pass .gpu-deps
# in the device call's carry list; run_gpu_tests.sh picks it up.
# note: copied from the installed packages' file lists (dpkg -L), so nothing is
# downloaded; .pc files are made relocatable with ${pcfiledir}.
set -euo pipefail
cd "$(dirname "$0")/../.."
ex="$(git rev-parse --git-path info/exclude)"; mkdir -p "$(dirname "$ex")"
grep -qx "/.gpu-deps/" "$ex" 2>/dev/null || echo "/.gpu-deps/" >> "$ex"
rm -rf .gpu-deps
mkdir -p .gpu-deps
pkgs="libfmt-dev libfmt9 nlohmann-json3-dev libgtest-dev libbenchmark-dev libbenchmark1debian
      libzip-dev libzip4 libutf8proc-dev libutf8proc2 libarchive-dev libarchive13 libcxxopts-dev
      libxxhash-dev libxxhash0 pkgconf pkgconf-bin libpkgconf3 zlib1g-dev"
for p in $pkgs; do
  dpkg -L "$p" | while read -r f; do
    case "$f" in /usr/share/doc/*|/usr/share/man/*|/usr/share/lintian/*) continue ;; esac
    if [ -f "$f" ] || [ -L "$f" ]; then
      mkdir -p ".gpu-deps$(dirname "$f")"
      cp -a "$f" ".gpu-deps$f"
    fi
  done
done
for pc in .gpu-deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc .gpu-deps/usr/share/pkgconfig/*.pc; do
  [ -f "$pc" ] || continue
  case "$pc" in
    */usr/share/*) sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../..|' "$pc" ;;
    *) sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../../..|' "$pc" ;;
  esac
done
du -sh .gpu-deps
