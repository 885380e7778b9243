// Pareto dominance for studies of several objectives (StudySpec.objectives):
// which trials no other trial dominates.
//
//   std::vector<size_t> front = ParetoFront({{0.1, 300}, {0.2, 100}, {0.3, 400}});
//   // {0, 1}: the third is worse than the first in both.
//
// Values are in minimize form (a maximized objective negated). Pure
// functions; thread-safe.
#ifndef MPILEARN_SERVER_OPT_PARETO_H_
#define MPILEARN_SERVER_OPT_PARETO_H_

#include <cstddef>
#include <vector>

namespace mpilearn::opt {

// Whether `a` dominates `b`: no worse in every objective and better in one.
bool Dominates(const std::vector<double>& a, const std::vector<double>& b);

// The indices of the points no other point dominates, ascending. Equal
// points are all on the front. O(n^2 k).
std::vector<size_t> ParetoFront(const std::vector<std::vector<double>>& points);

}  // namespace mpilearn::opt

#endif  // MPILEARN_SERVER_OPT_PARETO_H_
