"""Where the cuda backend's values live: on the device from a call's first statement to its last, with every
host<->device copy counted (fold.runtime.cuda_backend.counting_transfers). Under Numba's CUDA simulator the
device arrays refuse to be read as NumPy arrays (as CuPy's do), so a statement that used one on the host
without a counted copy fails here rather than going unseen."""

from __future__ import annotations

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")
if not cuda.is_available():
    pytest.skip("no CUDA GPU, and NUMBA_ENABLE_CUDASIM is not set", allow_module_level=True)

import fold  # noqa: E402
from fold.runtime.cuda_backend import counting_transfers  # noqa: E402
from fold.runtime.cuda_backend import device  # noqa: E402

rng = np.random.default_rng(11)


def grow(a, b):
    return a + b + a * b


def scan_then_reduce(x):
    """Two lowered statements (literal identities, nothing captured): the scan's result goes straight into
    the reduce."""
    return fold.reduce(grow, fold.scan(grow, x, identity=0.0), identity=0.0)


def test_two_lowered_statements_copy_only_the_input_and_the_output():
    x = rng.uniform(-0.001, 0.001, 300)
    with counting_transfers() as copies:
        got = fold.jit(scan_then_reduce, backend="cuda")(x)
    np.testing.assert_allclose(got, fold.jit(scan_then_reduce, backend="numpy")(x), rtol=1e-12)
    assert (copies.to_device, copies.to_host) == (1, 1), copies
    assert (copies.bytes_to_device, copies.bytes_to_host) == (x.nbytes, 8), copies


def test_results_left_on_the_device_and_device_arguments_are_not_copied():
    x = rng.uniform(-0.001, 0.001, 300)
    on_device = fold.jit(scan_then_reduce, backend="cuda", results="device")
    with counting_transfers() as copies:
        y = on_device(x)
    assert device.is_device(y) and y.shape == () and (copies.to_device, copies.to_host) == (1, 0), copies
    x_on_device = device.to_device(x)
    with counting_transfers() as copies:
        z = on_device(x_on_device)
        w = fold.jit(scan_then_reduce, backend="cuda")(x_on_device)  # NumPy result: one copy back
    assert (copies.to_device, copies.to_host) == (0, 1), copies
    expected = fold.jit(scan_then_reduce, backend="numpy")(x)
    for value in (device.to_host(y), device.to_host(z), w):
        np.testing.assert_allclose(value, expected, rtol=1e-12)


@pytest.mark.parametrize("between", ["structural", "elementwise", "product", "gather"])
def test_statements_between_kernels_stay_on_the_device_unless_they_need_the_host(between):
    """s[::-1], 0.5 * s and a matrix product run on the device (their NumPy calls take device arrays: CuPy on a
    GPU): the input is copied in and the result out, nothing between. A gather (an index array) still runs
    on the host: its input is copied there and its result back, one array each way."""
    x = rng.uniform(-0.001, 0.001, 300)
    w = rng.uniform(-1.0, 1.0, (300, 300))
    order = rng.permutation(300)
    middle = {"structural": lambda s: s[::-1], "elementwise": lambda s: 0.5 * s, "product": lambda s: w @ s,
              "gather": lambda s: s[order]}[between]

    def f(x):
        s = fold.scan(grow, x, identity=0.0)
        return fold.reduce(grow, middle(s), identity=0.0)

    with counting_transfers() as copies:
        got = fold.jit(f, backend="cuda")(x)
    np.testing.assert_allclose(got, fold.jit(f, backend="numpy")(x), rtol=1e-12)
    extra = {"structural": 0, "elementwise": 0, "product": 1, "gather": 1}[between]  # the product's w: a constant
    if between == "gather":
        assert (copies.to_device, copies.to_host) == (2, 2), copies
        assert copies.bytes_to_host == x.nbytes + 8 and copies.bytes_to_device == 2 * x.nbytes, copies
    else:
        assert (copies.to_device, copies.to_host) == (1 + extra, 1), copies
        assert copies.bytes_to_device == x.nbytes + extra * w.nbytes and copies.bytes_to_host == 8, copies


def test_a_gradient_whose_statements_are_all_lowered_copies_only_its_input():
    """The generic reduce rule's vjp of a * b is two exclusive scans and a map (capturing the literal
    cotangent 1.0): all three run as kernels on device arrays, and the result stays on the device."""
    x = rng.uniform(0.5, 1.5, 100)
    prod = lambda x: fold.reduce(lambda a, b: a * b, x, identity=1.0)  # noqa: E731
    grad = fold.jit(lambda x: fold.vjp(prod, x, reduce_rule="generic")[1](1.0), backend="cuda", results="device")
    with counting_transfers() as copies:
        (g,) = grad(x)
    np.testing.assert_allclose(device.to_host(g), np.prod(x) / x, rtol=1e-12)
    assert (copies.to_device, copies.to_host) == (1, 0), copies


def test_an_output_that_is_an_argument_is_a_copy_on_the_device():
    x = device.to_device(np.arange(4.0))
    y = fold.jit(lambda x: x, backend="cuda", results="device")(x)
    assert device.is_device(y) and y is not x
    np.testing.assert_array_equal(device.to_host(y), np.arange(4.0))


@pytest.mark.skipif(device._cupy() is not None, reason="the simulator's device arrays: CuPy's refuse NumPy by themselves")
def test_simulated_device_arrays_refuse_numpy():
    """What makes the counts honest on the simulator: NumPy cannot read a device array behind our back, nor
    mix one with a host array."""
    x = device.to_device(np.ones(3))
    for read in (np.asarray, lambda a: np.add(a, np.ones(3)), lambda a: np.concatenate([a, np.ones(3)]),
                 lambda a: np.array(a)):
        with pytest.raises(TypeError):
            read(x)
    # NumPy's calls on device arrays alone compute on the device (as CuPy's arrays make them do)
    for on_device in (np.add(x, 1.0), np.concatenate([x, x]), np.transpose(x), x @ x, np.sum(x)):
        assert device.is_device(on_device) or np.ndim(on_device) == 0
    np.testing.assert_array_equal(device.to_host(np.concatenate([x, x + 1.0])), [1, 1, 1, 2, 2, 2])


def test_the_results_option_is_checked():
    with pytest.raises(fold.FoldError, match="results must be one of 'numpy', 'device', got 'gpu'"):
        fold.jit(lambda x: x, backend="cuda", results="gpu")
    with pytest.raises(fold.FoldError, match="numpy backend keeps no values on a device.*backend='cuda'"):
        fold.jit(lambda x: x * 2.0, backend="numpy", results="device")(np.ones(3))
