// The one translation unit of kappa_torch_pch (cmake/torch_pch.cmake): the
// target exists to build the precompiled <torch/torch.h> every libtorch
// target reuses. It defines nothing.
