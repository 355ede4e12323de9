# Sourced by bench/gpu/prepare.sh and bench/gpu/run.sh: makes the bundle
# .gpu_deps (bench/gpu/prepare.sh) usable where it lies. The bundle holds no
# symbolic links (the carry to the GPU machine may not keep them); this
# creates the library names lib/x86_64-linux-gnu/links.txt lists (libX.so and
# the full version names Debian's CMake files import) and sets
#   kappa_deps, kappa_deps_lib   the bundle and its library directory
#   kappa_deps_cmake             the arguments that configure a build against it
# Use the bundle's protoc, plugin and pkg-config with
#   LD_LIBRARY_PATH=$kappa_deps_lib PKG_CONFIG_LIBDIR=$kappa_deps_lib/pkgconfig
kappa_deps=${KAPPA_GPU_DEPS:-$PWD/.gpu_deps}
kappa_deps_lib=$kappa_deps/lib/x86_64-linux-gnu
if [[ ! -f $kappa_deps_lib/links.txt ]]; then
  echo "no bundle at $kappa_deps: run bash bench/gpu/prepare.sh on the Debian machine, carry .gpu_deps" >&2
  return 1
fi
while read -r kappa_link kappa_target; do
  [[ -e $kappa_deps_lib/$kappa_link ]] || ln -s "$kappa_target" "$kappa_deps_lib/$kappa_link"
done < "$kappa_deps_lib/links.txt"
chmod +x "$kappa_deps"/bin/*
kappa_deps_cmake=(-C "$kappa_deps/cmake/kappa-deps.cmake"
                  -DCMAKE_PREFIX_PATH="$kappa_deps")
