"""Program transformations: forward mode (jvp) and reverse mode by re-execution (vjp).

Importing this package registers every rule.
"""

from . import elementwise_rules, fold_jvp, gemm_rules, loop_rules, map_rules, rbi_rules, reduce_rules, scan_rules, structural_rules  # noqa: F401
from .api import grad, jvp, value_and_grad, vjp, vjp_value
from .jacobians import hessian, jacfwd, jacrev, linearize
from .jvp import jvp_program, jvp_rules
from .vjp import GEMM_RULES, REDUCE_RULES, gemm_rule_scope, reduce_rule_scope, vjp_program, vjp_rules
from .zeros import Zero

__all__ = ["GEMM_RULES", "REDUCE_RULES", "Zero", "gemm_rule_scope", "grad", "jvp", "jvp_program", "jvp_rules", "reduce_rule_scope", "value_and_grad",
           "vjp", "vjp_value", "hessian", "jacfwd", "jacrev", "linearize", "vjp_program", "vjp_rules"]
