"""`verl-launch image import`: the enroot command it runs, the squashfs it names, reuse of an
existing file, and clear errors. enroot itself is not installable here (see README)."""

from __future__ import annotations

from launcher.jobs.images import enroot_uri, squashfs_name


def test_enroot_uris_and_file_names():
    assert enroot_uri("verlai/verl:tag") == "docker://verlai/verl:tag"
    assert enroot_uri("ubuntu") == "docker://ubuntu"
    # enroot separates a registry host with '#'
    assert enroot_uri("nvcr.io/nvidia/pytorch:24.01-py3") == "docker://nvcr.io#nvidia/pytorch:24.01-py3"
    assert enroot_uri("localhost:5000/verl:1") == "docker://localhost:5000#verl:1"
    assert squashfs_name("nvcr.io/nvidia/pytorch:24.01-py3") == "nvcr.io+nvidia+pytorch+24.01-py3.sqsh"


def test_dry_run_prints_the_command_and_the_container_image_to_use(cli, clean_env, tmp_path):
    proc = cli("image", "import", "verlai/verl:tag", "-o", tmp_path, "--dry-run", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert f"enroot import --output {tmp_path}/verlai+verl+tag.sqsh docker://verlai/verl:tag" in proc.stdout
    assert f"container.image={tmp_path}/verlai+verl+tag.sqsh" in proc.stdout


def test_an_imported_image_is_reused_not_pulled_again(cli, clean_env, tmp_path):
    (tmp_path / "verlai+verl+tag.sqsh").write_bytes(b"hsqs")  # as a finished import leaves it
    env = dict(clean_env, PATH="/usr/bin:/bin")  # no enroot: it must not be needed
    proc = cli("image", "import", "verlai/verl:tag", "-o", tmp_path, env=env)
    assert proc.returncode == 0 and "already imported" in proc.stdout


def test_without_enroot_it_fails_and_shows_the_command(cli, clean_env, tmp_path):
    env = dict(clean_env, PATH="/usr/bin:/bin")
    proc = cli("image", "import", "verlai/verl:tag", "-o", tmp_path, env=env)
    assert proc.returncode == 1 and "enroot not found" in proc.stderr and "docker://verlai/verl:tag" in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_bad_image_name_is_bad_input(cli, clean_env, tmp_path):
    proc = cli("image", "import", "verl;rm -rf /", "-o", tmp_path, env=clean_env)
    assert proc.returncode == 2 and "IMAGE" in proc.stderr
