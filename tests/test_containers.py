"""`hvdtrain cluster --image`: the podman commands (pure), and the one-line refusals.

The real runs of the image are in test_image.py (`make test-image`).
"""

from __future__ import annotations

import os

import pytest

from hvdtrain import cli
from hvdtrain.cluster import command, containers, requirements
from hvdtrain.cluster.containers import ImageSpec

SPEC = ImageSpec(image="hvdtrain:cpu", port=2222, podman="/usr/bin/podman", runtime="crun",
                 graph_root="/var/lib/containers/storage", graph_driver="overlay",
                 volumes=("/data/shared",))
STATE = "/run/hvdtrain-cluster/podman"


def _after(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


def test_the_runs_podman_keeps_its_containers_on_the_runs_tmpfs_and_only_reads_the_images():
    argv = containers.podman_base(SPEC, STATE)
    assert _after(argv, "--root") == [f"{STATE}/root"]
    assert _after(argv, "--runroot") == [f"{STATE}/runroot"]
    assert _after(argv, "--storage-opt") == ["additionalimagestore=/var/lib/containers/storage"]
    assert _after(argv, "--events-backend") == ["none"]


def test_a_host_container_joins_the_hosts_netns_and_runs_the_images_sshd():
    argv = containers.run_host(SPEC, STATE, "h2", "/run/hvdtrain-cluster/hosts", "/run/keys")
    assert argv[argv.index("run"):][:5] == ["run", "--detach", "--name", "h2", "--hostname"]
    assert _after(argv, "--network") == ["ns:/run/netns/h2"]
    assert "--no-hosts" in argv
    assert _after(argv, "--volume") == ["/run/hvdtrain-cluster/hosts:/etc/hosts:ro",
                                        "/run/keys:/root/.ssh:ro", "/data/shared:/data/shared"]
    assert _after(argv, "--cgroups") == ["disabled"]  # crun: no cgroup to leave behind
    assert "--cgroup-parent" not in argv
    assert argv[-2:] == ["hvdtrain:cpu", "/opt/hvdtrain/docker/start-sshd.sh"]


def test_under_runc_a_host_container_gets_the_runs_own_cgroup_parent(monkeypatch):
    """runc cannot run without cgroups: they go under a parent that is removed after the run."""
    monkeypatch.setattr(command, "check_image", lambda image, volumes: dict(
        vars(SPEC), volumes=list(SPEC.volumes), runtime="runc"))
    args = cli.build_parser().parse_args(["cluster", "--image", "hvdtrain:cpu", "--", "true"])
    first, second = (ImageSpec.from_dict(command._image(args)) for _ in range(2))
    assert first.cgroup_parent.startswith("/hvdtrain-cluster-")
    assert first.cgroup_parent != second.cgroup_parent  # one per run
    argv = containers.run_host(first, STATE, "h2", "/h", "/k")
    assert _after(argv, "--cgroup-parent") == [first.cgroup_parent]
    assert "--cgroups" not in argv


@pytest.mark.parametrize("cwd, expected", [("/data/shared", "/data/shared"),
                                           ("/data/shared/run", "/data/shared/run"),
                                           ("/data/shared2", None), ("/home/me", None)])
def test_the_command_starts_in_the_callers_folder_only_where_the_containers_see_it(cwd, expected):
    assert containers.workdir(cwd, SPEC.volumes) == expected
    argv = containers.exec_command(SPEC, STATE, "h1", ["horovodrun", "-np", "2"], cwd)
    assert _after(argv, "--workdir") == ([expected] if expected else [])


def test_the_command_keeps_its_pid_so_a_signal_reaches_it_and_not_only_podman():
    argv = containers.exec_command(SPEC, STATE, "h1", ["horovodrun", "-np", "2"], "/")
    name_at = argv.index("h1")
    assert argv[name_at:] == ["h1", "sh", "-c", f'echo $$ > {containers.COMMAND_PID} && exec "$@"',
                              "hvdtrain-command", "horovodrun", "-np", "2"]
    kill = containers.signal_command(SPEC, STATE, "h1", 2)
    assert kill[-4:] == ["h1", "sh", "-c", f"kill -2 $(cat {containers.COMMAND_PID})"]


def test_every_container_holds_the_runs_key_authorised_everywhere(tmp_path):
    files = containers.keys_folder(str(tmp_path), "PRIVATE", "PUBLIC")
    assert {os.path.basename(p): v for p, v in files.items()} == {
        "id_ed25519": ("PRIVATE", 0o600), "id_ed25519.pub": ("PUBLIC", 0o644),
        "authorized_keys": ("PUBLIC", 0o600)}


def test_the_sshd_port_is_the_images_label_or_2222():
    assert containers.ssh_port({"org.hvdtrain.ssh-port": "2200"}) == 2200
    assert containers.ssh_port(None) == containers.ssh_port({"other": "x"}) == 2222


def test_a_volume_without_an_image_is_refused_in_one_line_before_any_check(monkeypatch, capsys,
                                                                            tmp_path):
    monkeypatch.setattr(command, "check_all", lambda: pytest.fail("checked the machine first"))
    assert cli.main(["cluster", "--volume", str(tmp_path), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--volume needs --image" in err and str(tmp_path) in err


def _machine_is_fine(monkeypatch):
    monkeypatch.setattr(command, "check_all", lambda: {"unshare": "/usr/bin/unshare"})


def test_without_podman_the_image_cluster_says_what_to_install_in_one_line(monkeypatch, capsys):
    _machine_is_fine(monkeypatch)
    monkeypatch.setattr(requirements, "find_tool", lambda name: None)
    assert cli.main(["cluster", "--image", "hvdtrain:cpu", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs podman, which is not installed: apt-get install podman" in err


def test_with_docker_only_the_image_cluster_says_why_it_needs_podman(monkeypatch, capsys):
    _machine_is_fine(monkeypatch)
    monkeypatch.setattr(requirements, "find_tool",
                        lambda name: "/usr/bin/docker" if name == "docker" else None)
    assert cli.main(["cluster", "--image", "hvdtrain:cpu", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "docker's daemon keeps its containers outside" in err


def test_an_image_podman_does_not_have_is_one_line_saying_how_to_build_it(monkeypatch, capsys):
    _machine_is_fine(monkeypatch)
    monkeypatch.setattr(requirements, "find_tool", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(requirements, "_podman_json", lambda podman, *args: None)
    assert cli.main(["cluster", "--image", "nosuch:tag", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "image nosuch:tag is not in podman's image store" in err
    assert "make image" in err


def test_a_missing_volume_folder_is_one_line_naming_it(monkeypatch, capsys, tmp_path):
    _machine_is_fine(monkeypatch)
    monkeypatch.setattr(requirements, "find_tool", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(requirements, "_podman_json",
                        lambda podman, *args: [{"Labels": {}}] if "image" in args else {})
    missing = tmp_path / "nope"
    assert cli.main(["cluster", "--image", "x", "--volume", str(missing), "--", "true"]) == 2
    assert capsys.readouterr().err.endswith(f"--volume {missing}: no such folder\n")


def test_the_image_spec_travels_to_the_supervisor_as_json(monkeypatch):
    args = cli.build_parser().parse_args(["cluster", "--image", "x", "--", "echo"])
    image = dict(vars(SPEC), volumes=list(SPEC.volumes))
    spec = command.make_spec(args, {"unshare": "/usr/bin/unshare"}, image)
    assert ImageSpec.from_dict(spec["image"]) == SPEC


def test_the_command_learns_that_every_hosts_workers_share_one_machine():
    argv = containers.exec_command(SPEC, STATE, "h1", ["horovodrun", "-np", "2"], "/")
    assert _after(argv, "--env") == ["HVDTRAIN_HOSTS_SHARE_ONE_MACHINE=1"]
