#include "server/opt/pareto.h"

namespace mpilearn::opt {

bool Dominates(const std::vector<double>& a, const std::vector<double>& b) {
  bool better = false;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i] > b[i]) return false;
    if (a[i] < b[i]) better = true;
  }
  return better;
}

std::vector<size_t> ParetoFront(const std::vector<std::vector<double>>& points) {
  std::vector<size_t> front;
  for (size_t i = 0; i < points.size(); ++i) {
    bool dominated = false;
    for (size_t j = 0; j < points.size() && !dominated; ++j) {
      dominated = j != i && Dominates(points[j], points[i]);
    }
    if (!dominated) front.push_back(i);
  }
  return front;
}

}  // namespace mpilearn::opt
