# SPDX-License-Identifier: Apache-2.0
"""clc's output files: walked to without links that others control, never another user's
file, never a link at the name, replaced rather than truncated with --force."""

import os
import pwd
import stat

import pytest

from clc.errors import EXIT_USAGE, ClcError
from clc.outputs import MAX_LINKS, check_output, open_output, remove_output, resolve_parent

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="a file or link of another user is made with "
                                                 "os.chown / os.lchown, which needs root")


def unused_uid():
    for uid in range(12345, 12445):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    pytest.skip("no unused uid between 12345 and 12444")


def refused(fn, *args, **kwargs):
    """The message of the ClcError fn raises, which must be a usage error."""
    with pytest.raises(ClcError) as e:
        fn(*args, **kwargs)
    assert e.value.exit_code == EXIT_USAGE, e.value
    return str(e.value)


def write(path, force=False, data=b"clc output"):
    with open_output(path, force) as f:
        f.write(data)


@pytest.fixture
def home(tmp_path):
    """A folder of this user's alone, with a file in it that must not be touched."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "precious").write_text("precious\n")
    return home


# ---- the plain case ---------------------------------------------------------------------------

def test_a_new_file_is_made_private_and_written(tmp_path):
    out = tmp_path / "out.clc"
    check_output(out, force=False)
    old = os.umask(0o022)
    try:
        write(out)
    finally:
        os.umask(old)
    assert out.read_bytes() == b"clc output"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_mode_and_text(tmp_path):
    out = tmp_path / "r.txt"
    old = os.umask(0o022)
    try:
        with open_output(out, mode=0o644, text=True) as f:
            f.write("répertoire\n")
    finally:
        os.umask(old)
    assert out.read_text(encoding="utf-8") == "répertoire\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_a_relative_path_and_dot_dot(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a")
    write("b/../b/./out")
    assert (tmp_path / "a" / "b" / "out").read_bytes() == b"clc output"


def test_resolve_parent_gives_the_folder_and_the_name(tmp_path):
    (tmp_path / "d").mkdir()
    fd, name = resolve_parent(tmp_path / "d" / "x.clc")
    try:
        assert name == "x.clc"
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "d"))
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["dir/", "dir/.", "dir/.."])
def test_a_path_that_names_a_folder_is_refused(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    assert refused(check_output, name, True) == (f"{name} names a folder, not a file: name "
                                                 f"another file with -o")


# ---- links on the way -------------------------------------------------------------------------

def test_links_of_ours_in_the_middle_are_followed(tmp_path, home):
    # GIVEN a chain of links of this user's, in folders only this user can write: absolute,
    # relative, and one that climbs with ..
    links = tmp_path / "links"
    links.mkdir(mode=0o700)
    (links / "abs").symlink_to(home)
    (links / "rel").symlink_to("abs")
    (links / "up").symlink_to("../links/rel")
    out = links / "up" / "out.clc"
    # WHEN the output is checked and written through them
    check_output(out, force=False)
    write(out)
    # THEN the file is in the folder they lead to
    assert (home / "out.clc").read_bytes() == b"clc output"


def test_a_link_in_a_sticky_folder_of_roots_or_ours_is_followed(tmp_path, home):
    # GIVEN a folder like /tmp (everyone may write, the sticky bit set), and our link in it
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "mine").symlink_to(home)
    # THEN it is followed: nobody else can remove or rename our link there
    write(shared / "mine" / "out.clc")
    assert (home / "out.clc").exists()


@pytest.mark.parametrize("mode, who", [(0o777, "its group and others"), (0o757, "others"),
                                       (0o775, "its group")])
def test_a_link_in_a_folder_others_can_write_is_refused(tmp_path, home, mode, who):
    # GIVEN our own link, in a folder that others can write (they could swap the link)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    (shared / "x").symlink_to(home)
    out = shared / "x" / "precious"
    # THEN it is not followed, with or without --force, and the file it leads to is untouched
    expected = (f"cannot write {out}: {shared / 'x'} is a symbolic link in {shared}, which "
                f"{who} can write (mode {mode:04o}): clc does not write through links other "
                f"users control")
    for force in (False, True):
        assert refused(check_output, out, force) == expected
        assert refused(write, out, force) == expected
    assert (home / "precious").read_text() == "precious\n"


@needs_root
def test_another_users_link_in_the_middle_is_refused(tmp_path, home):
    # GIVEN /tmp/shared as another user's link to the victim's home, in a folder like /tmp
    uid = unused_uid()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    (tmp / "shared").symlink_to(home)
    os.lchown(tmp / "shared", uid, uid)
    out = tmp / "shared" / "precious"
    # WHEN the victim writes /tmp/shared/precious with --force
    message = refused(write, out, True)
    # THEN the link is not followed, and says whose it is
    assert message == (f"cannot write {out}: {tmp / 'shared'} is a symbolic link owned by uid "
                       f"{uid}: clc does not write through links other users control")
    assert refused(check_output, out, True) == message
    assert (home / "precious").read_text() == "precious\n"


@needs_root
def test_a_link_in_another_users_folder_is_refused(tmp_path, home):
    # GIVEN our own link in a folder that another user owns (its owner may replace the link)
    uid = unused_uid()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    (theirs / "x").symlink_to(home)
    os.chown(theirs, uid, uid)
    out = theirs / "x" / "out"
    assert refused(check_output, out, False) == (
        f"cannot write {out}: {theirs / 'x'} is a symbolic link in {theirs}, a folder of uid "
        f"{uid}: clc does not write through links other users control")
    assert not (home / "out").exists()


def test_a_loop_of_links_stops(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert refused(check_output, tmp_path / "a" / "out", False) == (
        f"cannot write {tmp_path / 'a' / 'out'}: more than {MAX_LINKS} symbolic links on the "
        f"way to it (a loop?)")


def test_forty_links_are_followed(tmp_path, home):
    (tmp_path / "l0").symlink_to(home)
    for i in range(1, MAX_LINKS):
        (tmp_path / f"l{i}").symlink_to(f"l{i - 1}")
    write(tmp_path / f"l{MAX_LINKS - 1}" / "out")
    assert (home / "out").exists()
    (tmp_path / f"l{MAX_LINKS}").symlink_to(f"l{MAX_LINKS - 1}")
    assert "more than 40 symbolic links" in refused(check_output,
                                                    tmp_path / f"l{MAX_LINKS}" / "x", False)


# ---- the last component -----------------------------------------------------------------------

@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_at_the_name_is_never_followed(home, force, dangling):
    # GIVEN a link of our own, where the output would go, to a file or to nowhere
    link = home / "out.clc"
    target = home / ("nowhere" if dangling else "precious")
    link.symlink_to(target)
    expected = (f"{link} is a symbolic link: clc does not write through links (remove it, or "
                f"name another file with -o)")
    # THEN both the check and the open refuse it, and nothing is written or made
    assert refused(check_output, link, force) == expected
    assert refused(write, link, force) == expected
    assert link.is_symlink() and (home / "precious").read_text() == "precious\n"
    assert not (home / "nowhere").exists()


def test_an_existing_file_needs_force(home):
    out = home / "precious"
    expected = f"{out} exists (use --force to overwrite it)"
    assert refused(check_output, out, False) == expected
    assert refused(write, out, False) == expected
    assert out.read_text() == "precious\n"
    check_output(out, True)
    write(out, True)
    assert out.read_bytes() == b"clc output"


def test_force_replaces_the_file_and_never_truncates_it(home):
    # GIVEN an old output that another process holds open
    out = home / "precious"
    old_inode = out.stat().st_ino
    with open(out, "rb") as held:
        # WHEN it is written again with --force
        write(out, True, b"new content")
        # THEN the holder still reads the old file, whole, and the name has a new file
        assert held.read() == b"precious\n"
        assert os.fstat(held.fileno()).st_nlink == 0
    assert out.read_bytes() == b"new content"
    assert out.stat().st_ino != old_inode
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_force_does_not_write_into_another_link_to_the_file(home):
    # GIVEN a second name (a hard link) for the old output
    out = home / "out"
    out.write_bytes(b"old")
    os.link(out, home / "other-name")
    # WHEN the output is written again with --force
    write(out, True)
    # THEN the other name keeps the old content
    assert (home / "other-name").read_bytes() == b"old"
    assert out.read_bytes() == b"clc output"


@needs_root
@pytest.mark.parametrize("force", [False, True])
def test_another_users_file_is_refused_even_with_force(home, force):
    # GIVEN a file that another user made at the output's name, writable by everyone
    uid = unused_uid()
    out = home / "planted.clc"
    out.write_text("theirs\n")
    os.chmod(out, 0o666)
    os.chown(out, uid, uid)
    expected = (f"{out} is owned by uid {uid}, another user: clc does not write into other "
                f"users' files (name another file with -o)")
    # THEN nothing is written into it or put in its place
    assert refused(check_output, out, force) == expected
    assert refused(write, out, force) == expected
    assert out.read_text() == "theirs\n" and out.stat().st_uid == uid


def test_a_missing_folder(tmp_path):
    out = tmp_path / "no" / "such" / "r.txt"
    expected = f"cannot write {out}: the folder {out.parent} does not exist"
    assert refused(check_output, out, False) == expected
    assert refused(write, out, True) == expected


def test_a_file_on_the_way_is_not_a_folder(home):
    out = home / "precious" / "r.txt"
    assert refused(check_output, out, False) == (
        f"cannot write {out}: {home / 'precious'} is a regular file, not a folder")


@pytest.mark.parametrize("make, kind", [(os.mkfifo, "a FIFO (named pipe)"),
                                        (os.mkdir, "a folder")])
def test_something_not_a_regular_file_is_refused_without_blocking(tmp_path, make, kind):
    out = tmp_path / "thing"
    make(out)
    expected = (f"{out} is {kind}, not a regular file: clc writes only regular files (name "
                f"another file with -o)")
    for force in (False, True):
        assert refused(check_output, out, force) == expected
        assert refused(write, out, force) == expected


def test_a_device_is_refused():
    assert "/dev/null is a character device, not a regular file" in refused(
        check_output, "/dev/null", True)


def test_a_folder_that_cannot_be_written(tmp_path, monkeypatch):
    # (root may write any folder: the access check is made to fail)
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
    assert refused(check_output, tmp_path / "x", False) == (
        f"cannot write {tmp_path / 'x'}: {tmp_path} is not writable")


def test_no_name_at_all():
    assert refused(check_output, "", False) == "no output file named: name one with -o"


# ---- taking an output back --------------------------------------------------------------------

def test_remove_output_removes_only_the_file_it_made(tmp_path):
    out = tmp_path / "r.txt"
    with open_output(out) as f:
        assert remove_output(out, f) and not out.exists()
    # GIVEN an output whose name has since been given to another file
    with open_output(out) as f:
        os.unlink(out)
        out.write_text("someone else's\n")
        # THEN that file is left alone
        assert not remove_output(out, f.fileno())
    assert out.read_text() == "someone else's\n"
