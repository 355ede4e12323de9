#!/usr/bin/env bash
# Run here (the Debian 12 machine) before bench/gpu/run.sh. The GPU machine
# (Ubuntu 24.04, g++ 13, PyTorch's libtorch) has no nlohmann_json, gRPC,
# protobuf, abseil, yaml-cpp, spdlog/fmt, pcre2/utf8proc headers or
# pkg-config, and no package registry. This copies Debian's into .gpu_deps/,
# which the device tool carries with the tree:
#   bash bench/gpu/prepare.sh
#   run(command="bash bench/gpu/run.sh", carry=[".gpu_deps"], timeout_s=540)
#
# Layout (a prefix shaped like /usr, so Debian's relocatable CMake package
# files work unchanged from it):
#   include/                       headers: nlohmann grpc grpcpp grpc++ google/protobuf
#                                  absl yaml-cpp spdlog fmt pcre2.h utf8proc.h
#   lib/x86_64-linux-gnu/          the shared libraries (soname files + libX.so links),
#                                  cmake/{grpc,absl,yaml-cpp,spdlog,fmt,c-ares,re2},
#                                  pkgconfig/{libpcre2-8,libutf8proc}.pc
#   bin/                           protoc, grpc_cpp_plugin, pkg-config (pkgconf)
#   cmake/modules/                 FindZLIB/FindOpenSSL from the host's runtime libz.so.1,
#                                  libssl.so.3, libcrypto.so.3 (no -dev package needed)
#   cmake/kappa-deps.cmake         initial cache for `cmake -C` (prefix, module path, pkg-config)
#   share/cmake/nlohmann_json/     header-only package (run.sh's first build uses it)
#   share/tokenizers/qwen2_5/      the real Qwen2.5 tokenizer (tokenizer.json.gz) for
#                                  run.sh's random Qwen-shaped checkpoints
# Not shipped, taken from the GPU machine (same sonames on Ubuntu 24.04, same
# or newer versions): libc/libm/libdl/librt/libpthread (glibc 2.39 >= 2.36),
# libstdc++.so.6 and libgcc_s.so.1 (gcc 13/14 >= 12), libssl.so.3 and
# libcrypto.so.3 (OpenSSL 3.0), libz.so.1.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
arch=x86_64-linux-gnu
sys=/usr/lib/$arch
[[ -d /usr/include/nlohmann && -d /usr/share/cmake/nlohmann_json ]] || {
  echo "prepare: nlohmann-json3-dev is not installed (bash scripts/setup.sh installs it)" >&2
  exit 1
}
for f in "$sys/cmake/grpc/gRPCConfig.cmake" /usr/bin/protoc /usr/bin/grpc_cpp_plugin \
         /usr/include/pcre2.h /usr/include/utf8proc.h /usr/bin/pkgconf; do
  [[ -e $f ]] || { echo "prepare: $f is missing (bash scripts/setup.sh installs the packages)" >&2; exit 1; }
done
# The real Qwen2.5 tokenizer (the ctest fixture hf_tokenizers exports it).
tok=""
for d in "${KAPPA_HF_TOKENIZERS:-}" build/tests/hf_tokenizers /tmp/kappa-gpu-rehearsal/tests/hf_tokenizers; do
  [[ -n $d && -f $d/qwen2_5/tokenizer.json ]] && { tok=$d/qwen2_5; break; }
done
if [[ -z $tok ]]; then
  echo "prepare: exporting the Hugging Face tokenizers (npm, cached) into /tmp/kappa-hf-tokenizers"
  bash tests/model/tokenizer_reference/install.sh /tmp/kappa-hf-tokenizers > /dev/null
  tok=/tmp/kappa-hf-tokenizers/qwen2_5
fi

deps=$root/.gpu_deps
rm -rf "$deps"
mkdir -p "$deps"/{include,bin,lib/$arch/cmake,lib/$arch/pkgconfig,cmake/modules,share/cmake,share/tokenizers/qwen2_5}
lib=$deps/lib/$arch

# --- headers
cp -r /usr/include/nlohmann "$deps/include/"
for h in grpc grpcpp grpc++ absl yaml-cpp spdlog fmt pcre2.h utf8proc.h; do
  cp -r "/usr/include/$h" "$deps/include/"
done
mkdir -p "$deps/include/google"
cp -r /usr/include/google/protobuf "$deps/include/google/"

# --- shared libraries: every soname the services' binaries, protoc and the
# plugin need beyond the host's own (ldd closure below checks it).
# No symbolic links in the bundle (the carry may not keep them): each file
# under its soname, and links.txt lists the other names (libX.so, and the
# full version Debian's CMake files name) that bench/gpu/deps_env.sh links on
# the machine that uses it.
copy_lib() {  # copy_lib SONAME
  local soname=$1 real base dev
  real=$(readlink -f "$sys/$soname")
  cp "$real" "$lib/$soname"
  strip --strip-unneeded "$lib/$soname"
  dev=${soname%%.so*}.so
  base=$(basename "$real")
  echo "$dev $soname" >> "$lib/links.txt"
  [[ $base == "$soname" ]] || echo "$base $soname" >> "$lib/links.txt"
}
for so in libgrpc++.so.1.51 libgrpc.so.29 libgpr.so.29 libupb.so.29 libaddress_sorting.so.29 \
          libgrpc_plugin_support.so.1.51 libre2.so.9 libcares.so.2 \
          libprotobuf.so.32 libprotoc.so.32 \
          libyaml-cpp.so.0.7 libspdlog.so.1.10 libfmt.so.9 \
          libpcre2-8.so.0 libutf8proc.so.2 libpkgconf.so.3; do
  copy_lib "$so"
done
# abseil: all of Debian's (64 libraries, 1.8 MB); gRPC's CMake targets
# reference many of them, and which ones a link pulls in depends on them.
for f in "$sys"/libabsl_*.so.20220623; do copy_lib "$(basename "$f")"; done

# --- code generation and pkg-config
cp /usr/bin/protoc /usr/bin/grpc_cpp_plugin "$deps/bin/"
cp "$(readlink -f /usr/bin/pkgconf)" "$deps/bin/pkg-config"
strip --strip-unneeded "$deps"/bin/*

# The library names, for the import checks and the ldd check below.
source bench/gpu/deps_env.sh

# --- CMake package files: Debian's, relocatable (the prefix is computed from
# the file's own location). Import checks of files not shipped here (gRPC's
# php/python/ruby plugins, grpc_unsecure, alts, reflection, channelz) are
# dropped, so only linking one of those would fail.
for p in grpc absl yaml-cpp spdlog fmt; do cp -r "$sys/cmake/$p" "$lib/cmake/"; done
python3 - "$deps" "$lib/cmake" << 'EOF'
import pathlib, re, sys
prefix, cmake = sys.argv[1], pathlib.Path(sys.argv[2])
dropped = []
for f in cmake.glob("*/*-none.cmake"):
    out = []
    for line in f.read_text().splitlines(keepends=True):
        m = re.match(r'list\(APPEND _cmake_import_check_files_for_(\S+) "([^"]+)" \)', line)
        if m and not pathlib.Path(m.group(2).replace("${_IMPORT_PREFIX}", prefix)).exists():
            dropped.append(m.group(1))
            continue
        out.append(line)
    f.write_text("".join(out))
print("prepare: import checks dropped for", ", ".join(sorted(set(dropped))) or "none")
EOF
# gRPCConfig.cmake's find_package(c-ares) and find_package(re2) try CONFIG
# mode first: two small package files for the bundled libraries.
for pkg in c-ares:cares:libcares.so.2 re2:re2:libre2.so.9; do
  IFS=: read -r name target soname <<< "$pkg"
  mkdir -p "$lib/cmake/$name"
  cat > "$lib/cmake/$name/$name-config.cmake" << EOF
# Written by bench/gpu/prepare.sh: Debian 12's $soname, bundled (no headers:
# only libgrpc links it).
get_filename_component(_kappa_lib "\${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT TARGET $name::$target)
  add_library($name::$target SHARED IMPORTED)
  set_target_properties($name::$target PROPERTIES IMPORTED_LOCATION "\${_kappa_lib}/$soname")
endif()
set(${name}_FOUND TRUE)
EOF
done
# gRPC's package asks for ZLIB and OpenSSL: the host's runtime libraries
# (Ubuntu 24.04: zlib1g, libssl3t64), no headers (nothing here includes them).
for pkg in ZLIB:ZLIB:libz.so.1 OpenSSL:SSL:libssl.so.3 OpenSSL:Crypto:libcrypto.so.3; do
  IFS=: read -r name target soname <<< "$pkg"
  file=$deps/cmake/modules/Find$name.cmake
  [[ -f $file ]] || cat > "$file" << EOF
# Written by bench/gpu/prepare.sh: $name from the host's runtime libraries,
# for gRPC's CMake package; no development package needed.
set(${name}_FOUND TRUE)
EOF
  cat >> "$file" << EOF
if(NOT TARGET $name::$target)
  unset(_kappa_so)
  foreach(_kappa_dir /usr/lib/$arch /lib/$arch /usr/lib64 /lib64 /usr/lib /lib)
    if(NOT _kappa_so AND EXISTS "\${_kappa_dir}/$soname")
      set(_kappa_so "\${_kappa_dir}/$soname")
    endif()
  endforeach()
  if(NOT _kappa_so)
    message(FATAL_ERROR "bench/gpu/prepare.sh's Find$name: no $soname on this machine")
  endif()
  add_library($name::$target SHARED IMPORTED)
  set_target_properties($name::$target PROPERTIES IMPORTED_LOCATION "\${_kappa_so}")
  list(APPEND ${name}_LIBRARIES "\${_kappa_so}")
endif()
EOF
done
echo 'set(OPENSSL_FOUND TRUE)' >> "$deps/cmake/modules/FindOpenSSL.cmake"
# pkg-config files of pcre2 and utf8proc, relative to themselves.
for pc in libpcre2-8 libutf8proc; do
  sed "s|^prefix=.*|prefix=\${pcfiledir}/../../..|" "$sys/pkgconfig/$pc.pc" > "$lib/pkgconfig/$pc.pc"
done
cat > "$deps/cmake/kappa-deps.cmake" << 'EOF'
# Initial cache of a build against this bundle (cmake -C .gpu_deps/cmake/kappa-deps.cmake),
# written by bench/gpu/prepare.sh. Its headers go first on every include path
# (KAPPA_DEPS_INCLUDE_FIRST), ahead of the protobuf and fmt copies a pip
# libtorch ships in torch/include. Needs LD_LIBRARY_PATH=<this>/lib/x86_64-linux-gnu
# for protoc and pkg-config (bench/gpu/run.sh sets it).
get_filename_component(_kappa_deps "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(CMAKE_MODULE_PATH "${_kappa_deps}/cmake/modules" CACHE STRING "")
set(KAPPA_DEPS_INCLUDE_FIRST "${_kappa_deps}/include" CACHE PATH "")
set(PKG_CONFIG_EXECUTABLE "${_kappa_deps}/bin/pkg-config" CACHE FILEPATH "")
set(nlohmann_json_DIR "${_kappa_deps}/share/cmake/nlohmann_json" CACHE PATH "")
set(Protobuf_PROTOC_EXECUTABLE "${_kappa_deps}/bin/protoc" CACHE FILEPATH "")
EOF
cp -r /usr/share/cmake/nlohmann_json "$deps/share/cmake/"

# --- the real Qwen2.5 tokenizer, compressed (7 MB -> 1.9 MB)
gzip -9 -c "$tok/tokenizer.json" > "$deps/share/tokenizers/qwen2_5/tokenizer.json.gz"
cp "$tok/tokenizer_config.json" "$deps/share/tokenizers/qwen2_5/"

# --- check: every library the bundle's binaries and libraries need is in it
# or is one the GPU machine has (see the header).
host_libs='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libssl|libcrypto|libz)\.so'
missing=$(for f in "$lib"/*.so.* "$deps"/bin/*; do
  LD_LIBRARY_PATH=$lib ldd "$f" | awk '$2 == "=>" || $1 ~ /^\// {print $1, $3}'
done | sort -u | awk -v lib="$lib" '$2 !~ "^"lib {n = split($1, p, "/"); print p[n]}' |
  grep -Ev "$host_libs" || true)
[[ -z $missing ]] || { echo "prepare: not bundled and not on the GPU machine: $missing" >&2; exit 1; }

# The links are made again where the bundle is used (bench/gpu/deps_env.sh).
find "$deps" -type l -delete
{
  echo "# .gpu_deps, written by bench/gpu/prepare.sh on $(date -u +%F) from Debian $(cat /etc/debian_version)"
  dpkg-query -W -f '${Package} ${Version}\n' libgrpc++1.51 libprotobuf32 libabsl20220623 \
    libyaml-cpp0.7 libspdlog1.10 libfmt9 libpcre2-8-0 libutf8proc2 libc-ares2 libre2-9 2>/dev/null || true
} > "$deps/MANIFEST"
grep -qx '/.gpu_deps/' .git/info/exclude 2>/dev/null || echo '/.gpu_deps/' >> .git/info/exclude
echo "prepare: .gpu_deps/ ready: $(du -sb "$deps" | cut -f1) bytes ($(du -sh "$deps" | cut -f1)): \
include $(du -sb "$deps/include" | cut -f1), lib $(du -sb "$deps/lib" | cut -f1), \
bin $(du -sb "$deps/bin" | cut -f1), tokenizer $(du -sb "$deps/share/tokenizers" | cut -f1); \
carry it to the GPU machine"
