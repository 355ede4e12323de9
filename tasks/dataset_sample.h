// A subset of a dataset that has the whole dataset's mix.
//
// The arithmetic splits list problems in draw order, and the draws are not
// uniform over problems (digit counts first), so the first problems of a
// split that nearly exhausts its problem space over-represent short operands
// (one-digit and mixed-length ones, of which few exist) and the last are
// mostly two long operands. A measurement on "the first N" of such a split
// is biased; one on an evenly spaced sample is not.
#pragma once

#include <cstddef>

#include "tasks/dataset.h"
#include "tasks/vector_dataset.h"

namespace kappa::tasks {

// Copies of the examples at indices ⌊i · n / count⌋, i = 0 … count − 1,
// where n = min(population, dataset.size()): `count` examples spread evenly
// over the first n, in the dataset's order. All n of them when count >= n;
// none when count is 0.
VectorDataset EvenlySpacedSample(const Dataset& dataset, size_t population, size_t count);

}  // namespace kappa::tasks
