"""actors.stack_environment: the Serve settings a Ray started by specdec inherits, where the
operator has not set them."""

from __future__ import annotations

from actors.stack_environment import STACK_ENVIRONMENT, export_stack_environment


def test_an_empty_environment_gets_every_setting():
    environ: dict[str, str] = {}
    assert export_stack_environment(environ) == STACK_ENVIRONMENT
    assert environ == STACK_ENVIRONMENT


def test_an_operators_own_value_wins():
    environ = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1", "OTHER": "kept"}
    in_force = export_stack_environment(environ)
    assert in_force["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.1"
    assert environ["OTHER"] == "kept"
    assert {k: v for k, v in in_force.items() if k != "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"} == \
        {k: v for k, v in STACK_ENVIRONMENT.items() if k != "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"}


def test_every_setting_is_a_serve_constant_that_parses():
    """Each name is one Ray Serve reads (ray.serve._private.constants), each value one it accepts."""
    import ray.serve._private.constants as constants

    source = open(constants.__file__).read()
    for name, value in STACK_ENVIRONMENT.items():
        assert f'"{name}"' in source, name
        assert float(value) >= 0
