#!/usr/bin/env bash
# The Debian packages binlens's own commands need, installed when missing.
#   scripts/system-packages.sh run    what `make run` needs (a C compiler, python3-venv, gdb)
#   scripts/system-packages.sh test   what `make test` needs (cross toolchains, clang, graphviz, postgresql...)
#   scripts/system-packages.sh ci     the test set plus the MCP conformance suite's (npm, curl)
# As root it runs apt-get; otherwise it prints the exact command and goes on, and the tests whose
# tools are missing skip with the package to install.
set -euo pipefail
purpose="${1:-test}"

need=()
want() {  # want CHECK PACKAGE: CHECK is a command name or an absolute path that must exist
  local check="$1" package="$2"
  if [[ "$check" == /* ]]; then [[ -e "$check" ]] && return 0; else command -v "$check" >/dev/null 2>&1 && return 0; fi
  [[ " ${need[*]-} " == *" $package "* ]] || need+=("$package")
}

want cc gcc
want make make
want gdb gdb                                           # the debugger provider (binlens serve --allow-debug)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)

if [[ "$purpose" == test || "$purpose" == ci ]]; then
  want objdump binutils
  want readelf binutils
  want git git
  want dot graphviz                                    # binlens cfg --format svg|png
  want clang clang                                     # AArch64/ARM/MIPS jump-table builds
  # PostgreSQL for the corpus store's tests: they start their own server (initdb + pg_ctl in a
  # temporary folder, tests/corpus_support.py); Debian installs it under /usr/lib/postgresql/N/bin
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
  # Cross toolchains of the jump-table, i386 and ARM tests (GNU as/ld/strip and gcc per target)
  # and the target's C library, which fixtures linked as PIEs need (a cross gcc only recommends it);
  # i386: the i686 cross gcc and its libc (gcc-multilib would remove the cross compilers)
  for spec in aarch64-linux-gnu:arm64 powerpc-linux-gnu:powerpc riscv64-linux-gnu:riscv64 \
      mips-linux-gnu:mips mipsel-linux-gnu:mipsel mips64-linux-gnuabi64:mips64 arm-linux-gnueabihf:armhf \
      powerpc64le-linux-gnu:ppc64el i686-linux-gnu:i386; do
    triple="${spec%%:*}"
    want "$triple-ld" "binutils-$triple"
    want "$triple-objdump" "binutils-$triple"
    want "$triple-gcc" "gcc-$triple"
    want "/usr/$triple/include/stdio.h" "libc6-dev-${spec#*:}-cross"
  done
fi
if [[ "$purpose" == ci ]]; then
  want curl curl
  want npm npm                                         # MCP conformance suite (tests/conformance/run.sh)
fi

((${#need[@]})) || exit 0
command="apt-get update -qq && apt-get install -y -qq ${need[*]}"
if [[ "$(id -u)" != 0 ]]; then
  echo "binlens: missing system packages for '$purpose'; as root run:" >&2
  echo "  sudo sh -c '$command'" >&2
  exit 0
fi
echo "binlens: installing system packages for '$purpose': ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
