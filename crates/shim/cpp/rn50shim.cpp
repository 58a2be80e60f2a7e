// rn50's C++ shims, compiled as one translation unit (the `rn50shim` library, crates/shim/build.rs): each of them
// includes ATen's and autograd's headers, which take a compiler 13-15 s to parse and compile however little a file
// uses of them. One unit pays that once instead of five times: the five took 179 CPU-seconds apart, 101 together
// (g++ 12 at -O3, the 2-core CI machine; docs/testing.md).
// Each file keeps its code in a namespace of its own, so that what one declares for itself cannot meet another's.
#include "shim.cpp"
#include "fused_bn.cpp"
#include "pool.cpp"
#include "profile.cpp"
#include "fused_block.cpp"
#include "graph.cpp"
