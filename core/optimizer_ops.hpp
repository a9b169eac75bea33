#pragma once
// The checks and CPU implementations of the Backend's optimizer operations
// (adamw_multi, sum_of_squares, sgd_update), shared by both backends.
#include "core/backend.hpp"

namespace hg {

// Lists of equal length; every param / grad / m / v of one shape, dtype
// (`allowed`: F32, or F32 / F64 on the CPU) and the device of state; compute
// copies BF16 of the param's shape where defined; state F64 (kAdamWStateSize,).
void check_adamw_group(const AdamWGroup& group, const AdamWConfig& config, const Tensor& state, bool allow_f64,
                       const char* op);
void check_sum_of_squares(const std::vector<Tensor>& xs, const Tensor& out, bool allow_f64, const char* op);
void check_sgd_update(const Tensor& p, const Tensor& g, const Tensor* velocity, bool allow_f64, const char* op);

namespace cpu {
void adamw_multi(const AdamWGroup& group, const AdamWConfig& config, Tensor& state);
void sum_of_squares(const std::vector<Tensor>& xs, Tensor& out);
void sgd_update(Tensor& p, const Tensor& g, Tensor* velocity, double lr, double momentum, double weight_decay);
}  // namespace cpu

}  // namespace hg
