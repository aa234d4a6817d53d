# SPDX-License-Identifier: Apache-2.0
"""Opening the files clc writes (a capture, a report) with nobody else's hands on them.

Problem: an output path is named by the user but may pass through folders that other users
can write, /tmp first of all. A symbolic link that another user planted there, in the middle
of the path or at its end, would send clc's output (the policy, the command line, a report)
into a file of the link owner's choosing, or over a file of the user's own; a file that
another user made at the name, readable by all, would receive it. Checking the path with
stat() and then opening it by name leaves the gap between the two to whoever can change
the path.

Solution: the path is walked one component at a time from a descriptor (O_PATH, O_NOFOLLOW,
O_DIRECTORY, each step relative to the last), as the kernel would walk it, but a symbolic
link on the way is followed only when nobody else can have made or changed it: the link is
root's or the user's, and so is the folder that holds it, which no one else can write
(group and others without write permission, or the sticky bit, which keeps others from
removing or renaming the link). At most MAX_LINKS links are followed, as by the kernel. A
link at the last component is never followed. The walk ends with a descriptor of the final
folder and the final name; everything after it is relative to that descriptor, so a
component changed after the walk changes nothing. The file is always created anew
(O_CREAT|O_EXCL|O_NOFOLLOW): an existing file, only when it is a regular file of the user's
own and --force was given, is unlinked first, never truncated in place (another process may
hold it open, or read it as it is emptied).

check_output is what clc-run checks before the program starts; open_output opens a file
that clc itself writes (clc report -o); remove_output takes such a file back when what was
to fill it failed. They raise ClcError, with EXIT_USAGE where the path is the user's to
change.
"""

import errno
import os
import pwd
import stat

from clc.errors import EXIT_USAGE, ClcError
from clc.words import FILE_KINDS, file_kind

__all__ = ["MAX_LINKS", "resolve_parent", "check_output", "open_output", "remove_output"]

# The kernel's own limit on the links followed in one path (MAXSYMLINKS).
MAX_LINKS = 40
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Others may unlink and re-create a name at once: a create that keeps meeting a file gives up.
_CREATE_TRIES = 3
_HINT = "name another file with -o"

# Output messages speak of folders.
_KINDS = {**FILE_KINDS, "directory": "a folder"}


def _kind(st):
    return file_kind(st.st_mode, _KINDS)


def _user(uid):
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _trusted(uid):
    """Root's and this user's (the effective uid: the one the files are made as)."""
    return uid == 0 or uid == os.geteuid()


def _usage(text):
    return ClcError(text, EXIT_USAGE)


def _text(path):
    text = os.fsdecode(os.fspath(path))
    if not text:
        raise _usage("no output file named: name one with -o")
    return text


def _folder(text):
    return os.path.dirname(text) or "."


def _link_refusal(shown, link, holder, where):
    """Why the link `shown` (its lstat: link) in the folder `where` (its fstat: holder) may
    not be followed; None when it may."""
    if not _trusted(link.st_uid):
        return f"{shown} is a symbolic link owned by {_user(link.st_uid)}"
    if not _trusted(holder.st_uid):
        return f"{shown} is a symbolic link in {where}, a folder of {_user(holder.st_uid)}"
    writable = holder.st_mode & 0o022
    if writable and not holder.st_mode & stat.S_ISVTX:
        who = {0o020: "its group", 0o002: "others", 0o022: "its group and others"}[writable]
        return (f"{shown} is a symbolic link in {where}, which {who} can write (mode "
                f"{stat.S_IMODE(holder.st_mode):04o})")
    return None


def _open_dir(name, text, shown, dir_fd=None):
    """An O_PATH descriptor of the folder name (in dir_fd); the walk's errors as ClcError."""
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        raise _usage(f"cannot write {text}: the folder {_folder(text)} does not exist") from None
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            # A folder when it was looked at, something else now.
            raise _usage(f"cannot write {text}: {shown} changed while clc was checking it") \
                from None
        raise _usage(f"cannot write {text}: {shown}: {e.strerror or e}") from None


def _move(fd, new):
    os.close(fd)
    return new


def resolve_parent(path):
    """(descriptor, name): an O_PATH descriptor of the folder that holds path's last
    component, and that component, walked as described in the module's doc (links followed
    only where nobody else controls them). The caller closes the descriptor. ClcError
    (EXIT_USAGE) names the component that stops the walk and why."""
    text = _text(path)
    parts = text.split("/")
    name = parts[-1]
    if name in ("", ".", ".."):
        raise _usage(f"{text} names a folder, not a file: {_HINT}")
    if text.startswith("/"):
        fd, where = _open_dir("/", text, "/"), "/"
    else:
        fd = _open_dir(".", text, "the current folder")
        try:
            where = os.getcwd()
        except OSError:
            where = "."
    pending = [p for p in reversed(parts[:-1]) if p not in ("", ".")]
    links = 0
    try:
        while pending:
            part = pending.pop()
            if part == "..":
                # The folder's real parent, as the kernel takes it: after a link, the parent
                # of where the link led.
                fd = _move(fd, _open_dir("..", text, where, fd))
                where = os.path.dirname(where)
                continue
            shown = os.path.join(where, part)
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise _usage(f"cannot write {text}: the folder {_folder(text)} does not "
                             f"exist") from None
            except OSError as e:
                raise _usage(f"cannot write {text}: {shown}: {e.strerror or e}") from None
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise _usage(f"cannot write {text}: more than {MAX_LINKS} symbolic links "
                                 f"on the way to it (a loop?)")
                why = _link_refusal(shown, st, os.fstat(fd), where)
                if why is not None:
                    raise _usage(f"cannot write {text}: {why}: clc does not write through "
                                 f"links other users control")
                try:
                    target = os.readlink(part, dir_fd=fd)
                except OSError as e:
                    raise _usage(f"cannot write {text}: {shown}: {e.strerror or e}") from None
                if not target:
                    raise _usage(f"cannot write {text}: {shown} is an empty symbolic link")
                if target.startswith("/"):
                    fd, where = _move(fd, _open_dir("/", text, "/")), "/"
                pending.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise _usage(f"cannot write {text}: {shown} is {_kind(st)}, not a folder")
            fd = _move(fd, _open_dir(part, text, shown, fd))
            where = shown
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def _refuse_existing(text, st, force):
    """Raise unless the existing file (its lstat: st) may be replaced."""
    if stat.S_ISLNK(st.st_mode):
        raise _usage(f"{text} is a symbolic link: clc does not write through links (remove "
                     f"it, or {_HINT})")
    if not stat.S_ISREG(st.st_mode):
        raise _usage(f"{text} is {_kind(st)}, not a regular file: clc writes only regular "
                     f"files ({_HINT})")
    if st.st_uid != os.geteuid():
        raise _usage(f"{text} is owned by {_user(st.st_uid)}, another user: clc does not "
                     f"write into other users' files ({_HINT})")
    if not force:
        raise _usage(f"{text} exists (use --force to overwrite it)")


def check_output(path, force):
    """Refuse, before anything is written, an output path that clc could not or must not
    write: a folder on the way that is missing or not a folder, a link on the way that
    another user controls (resolve_parent), a final folder this user cannot write, a link at
    the last component (never followed), something that is not a regular file, a file of
    another user's (even with force), an existing file without force. ClcError
    (EXIT_USAGE)."""
    text = _text(path)
    dir_fd, name = resolve_parent(text)
    try:
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=dir_fd):
            raise _usage(f"cannot write {text}: {_folder(text)} is not writable")
        st = _existing(dir_fd, name)
        if st is not None:
            _refuse_existing(text, st, force)
    finally:
        os.close(dir_fd)


def _existing(dir_fd, name):
    """The stat of what name is in dir_fd, the link itself if it is one; None if nothing."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _create(dir_fd, name, text, force, mode):
    """The descriptor of a new file name in dir_fd, an old one of this user's unlinked first
    when force."""
    for _ in range(_CREATE_TRIES):
        try:
            return os.open(name, _CREATE, mode, dir_fd=dir_fd)
        except FileExistsError:
            pass
        st = _existing(dir_fd, name)
        if st is None:
            continue
        _refuse_existing(text, st, force)
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
    raise _usage(f"cannot write {text}: a file there was made again each time clc removed it")


def open_output(path, force=False, mode=0o600, *, text=False, buffering=-1):
    """A new file at path, opened for writing: binary, or with text UTF-8 text (buffering as
    for open()). Refused as by check_output; the folder is the one resolve_parent walked to,
    and the file is made there O_CREAT|O_EXCL|O_NOFOLLOW with mode (less the umask). With
    force, an existing regular file of this user's is unlinked and the file made afresh: a
    process that holds the old one open keeps the old one. ClcError: EXIT_USAGE for a path to
    change, 1 for a failure of the system (a full disk, an I/O error)."""
    shown = _text(path)
    dir_fd, name = resolve_parent(shown)
    try:
        try:
            fd = _create(dir_fd, name, shown, force, mode)
        except ClcError:
            raise
        except OSError as e:
            if e.errno == errno.ELOOP:
                # A link that appeared at the name after it was looked at.
                raise _usage(f"{shown} is a symbolic link: clc does not write through links "
                             f"(remove it, or {_HINT})") from None
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise _usage(f"cannot write {shown}: {_folder(shown)} is not writable "
                             f"({e.strerror})") from None
            raise ClcError(f"cannot write {shown}: {e.strerror or e}") from None
    finally:
        os.close(dir_fd)
    try:
        if text:
            return os.fdopen(fd, "w", encoding="utf-8", buffering=buffering)
        return os.fdopen(fd, "wb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def remove_output(path, output):
    """Remove the file that open_output made at path (output: its file object or descriptor,
    still open), when what was to fill it failed; only while path still names that very file.
    True when it was removed; never raises for the path."""
    fd = output if isinstance(output, int) else output.fileno()
    made = os.fstat(fd)
    try:
        dir_fd, name = resolve_parent(path)
    except (ClcError, OSError):
        return False
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) != (made.st_dev, made.st_ino):
            return False
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(dir_fd)
