"""The head pod stops like `specdec serve` on SIGTERM: its preStop hook drains the routers
(`specdec drain`) for serving.shutdown_grace_s, and terminationGracePeriodSeconds covers that
grace period plus Ray's teardown, so Kubernetes never kills a drain half way. Every router
replica runs on the head (Ray's head-node resource in the Serve config), so none runs on a pod
that stops without a drain, and a head that restarts (GCS fault tolerance) never leaves a
worker pod's replica drained behind it."""

from __future__ import annotations

import math

import chart_views as view
from chart_views import VALUES

from specdec.config.config import ServingConfig
from specdec_cli.drain_cli import run_drain
from specdec_cli.serve_cli import build_parser


def stop_settings(docs) -> tuple[list[str], int]:
    pod = view.head(docs)["template"]
    return view.container(pod)["lifecycle"]["preStop"]["exec"]["command"], pod["spec"]["terminationGracePeriodSeconds"]


def test_the_default_grace_period_is_the_config_schemas(rendered):
    command, termination = stop_settings(rendered)
    grace = ServingConfig.model_fields["shutdown_grace_s"].default
    assert command == ["specdec", "drain", "--app", VALUES["serve"]["appName"], "--replicas", "1",
                       "--grace", str(math.ceil(grace))]
    assert termination == math.ceil(grace) + VALUES["head"]["stopTeardownSeconds"]


def test_the_grace_period_and_the_replicas_follow_the_specdec_config(render):
    command, termination = stop_settings(render(specdec__config__serving__shutdown_grace_s=7.5,
                                                specdec__config__serving__router_replicas=3,
                                                head__stopTeardownSeconds=12))
    assert command[command.index("--grace") + 1] == "8" and command[command.index("--replicas") + 1] == "3"
    assert termination == 8 + 12


def test_the_router_replicas_run_on_the_head_whose_prestop_drains_them(render, rendered):
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME
    from ray.serve.schema import DeploymentSchema

    from actors.app import build_app

    for docs, replicas in ((rendered, 1), (render(specdec__config__serving__router_replicas=8), 8)):
        (app,) = view.serve_config(docs)["applications"]
        (router,) = app["deployments"]
        DeploymentSchema.model_validate(router)
        built = build_app(app["args"])._bound_deployment
        assert router["name"] == built.name  # Serve refuses options for a deployment the app lacks
        options = router["ray_actor_options"]
        share = options.pop("resources").pop(HEAD_NODE_RESOURCE_NAME)
        assert options == built.ray_actor_options, "the code's options (num_cpus 0), which these replace"
        assert 0 < share and share * replicas <= 1, "every replica fits on the head"
        assert "lifecycle" in view.container(view.head(docs)["template"])
        assert not any("lifecycle" in view.container(g["template"]) for g in view.workers(docs).values())


def test_the_prestop_command_is_one_the_cli_accepts(rendered):
    command, _ = stop_settings(rendered)
    args = build_parser().parse_args(command[1:])
    assert args.func is run_drain
    assert (args.app, args.replicas, args.grace) == (VALUES["serve"]["appName"], 1, float(command[-1]))
