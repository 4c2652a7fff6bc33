"""Stop every rank within a second when one dies, where no launcher does.

torchrun ends every rank when one fails; ``srun`` does so only with
``--kill-on-bad-exit=1``. Without it, the surviving tasks of a job whose
rank was killed (``SIGKILL``, the out-of-memory killer, a lost node) wait
in their next collective until the collective timeout (NCCL: minutes),
holding the allocation and saying nothing of why.

:class:`PeerWatchdog` connects every rank to rank 0 with a plain TCP
socket (rank 0 publishes its port in the process group's store). A thread
on each rank blocks in ``recv``: the kernel closes a dead process's
sockets at once, whatever the process was doing, so a death is seen in
milliseconds, with no heartbeat that a busy interpreter (a long save, a
C call holding the GIL) could miss. Rank 0 sees any peer's socket close
and tells the others which rank it was; the others see rank 0's close.
A rank that ends its run as planned (training finished, or stopped by
:class:`~mmddp_ext.hooks.PreemptionHook`) says so first
(:func:`announce_planned_exit`), and its closing alarms no one. On an
alarm, each rank logs which rank stopped, on which host, and exits with
:data:`PEER_LOST_EXIT_CODE`.
"""
import atexit
import os
import selectors
import socket
import sys
import threading
import time
from typing import Dict, Optional

PEER_LOST_EXIT_CODE = 75
# Set to 0 to leave a lost rank to the launcher and the collective timeout.
WATCHDOG_ENV = 'MMDDP_EXT_PEER_WATCHDOG'
_PORT_KEY = 'mmddp_ext/peer_watchdog/port'
_CONNECT_TIMEOUT_S = 60
_watchdog: Optional['PeerWatchdog'] = None


def _say(message: str) -> None:
    """Write to stderr and the current MMEngine log, from any thread."""
    try:
        from mmengine.logging import print_log
        print_log(message, logger='current', level=40)
    except Exception:  # logging torn down: stderr below still says it
        pass
    sys.stderr.write(message + '\n')
    sys.stderr.flush()
    sys.stdout.flush()


class PeerWatchdog:
    """The socket mesh of :mod:`peer_watchdog` on one rank.

    Args:
        store: The process group's store (rank 0 publishes its port).
        rank (int): This rank.
        world_size (int): Number of ranks.
        master_addr (str): Where the other ranks reach rank 0
            (``MASTER_ADDR``).
    """

    def __init__(self, store, rank: int, world_size: int,
                 master_addr: str) -> None:
        self.rank = rank
        self.world_size = world_size
        self.host = socket.gethostname()
        self._planned = False
        self._lock = threading.Lock()
        self._peers: Dict[socket.socket, str] = {}
        if rank == 0:
            server = socket.create_server(('', 0))
            store.set(_PORT_KEY, str(server.getsockname()[1]))
            target = self._serve
            args = (server, )
        else:
            port = int(store.get(_PORT_KEY))
            conn = socket.create_connection((master_addr, port),
                                            timeout=_CONNECT_TIMEOUT_S)
            conn.settimeout(None)
            conn.sendall(f'hello {rank} {self.host} {os.getpid()}\n'.encode())
            self._peers[conn] = 'rank 0'
            target = self._watch_rank0
            args = (conn, )
        self._thread = threading.Thread(
            target=target,
            args=args,
            name='mmddp_ext-peer-watchdog',
            daemon=True)
        self._thread.start()
        atexit.register(self._close)

    # ------------------------------------------------------------ messages
    def announce_planned_exit(self) -> None:
        """Tell the peers that this rank's coming exit is planned."""
        with self._lock:
            self._planned = True
            for conn in list(self._peers):
                try:
                    conn.sendall(b'done\n')
                except OSError:
                    pass

    def _close(self) -> None:
        with self._lock:
            for conn in list(self._peers):
                try:
                    conn.close()
                except OSError:
                    pass

    def _stop_process(self, lost: str, how: str) -> None:
        with self._lock:
            if self._planned:
                return
        _say(f'mmddp_ext: {lost} {how}: it was killed (SIGKILL, out of '
             'memory, a lost node) or failed; see its log. Rank '
             f'{self.rank} on {self.host} stops now instead of waiting in '
             'its next collective for the timeout. Resume from the latest '
             'checkpoint (a requeued or restarted run of ExtRunner does by '
             'itself).')
        os._exit(PEER_LOST_EXIT_CODE)

    # ----------------------------------------------------------- threads
    def _watch_rank0(self, conn: socket.socket) -> None:
        lines = _lines(conn)
        rank0_done = False
        for line in lines:
            if line == 'done':
                rank0_done = True
            elif line.startswith('lost '):
                self._stop_process(line[5:], 'stopped')
        if not rank0_done:
            self._stop_process('rank 0', 'stopped (its connection closed)')

    def _serve(self, server: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(server, selectors.EVENT_READ)
        buffers: Dict[socket.socket, bytes] = {}
        names: Dict[socket.socket, str] = {}
        done = set()
        connected = 0
        while True:
            for key, _ in selector.select():
                sock = key.fileobj
                if sock is server:
                    conn, _ = server.accept()
                    selector.register(conn, selectors.EVENT_READ)
                    buffers[conn] = b''
                    names[conn] = 'a rank'
                    with self._lock:
                        self._peers[conn] = 'a rank'
                    connected += 1
                    if connected == self.world_size - 1:
                        selector.unregister(server)
                        server.close()
                    continue
                data = _recv(sock)
                if data:
                    buffers[sock] += data
                    *complete, buffers[sock] = buffers[sock].split(b'\n')
                    for line in (c.decode() for c in complete):
                        if line.startswith('hello '):
                            _, rank, host, pid = line.split()
                            names[sock] = f'rank {rank} (host {host}, pid ' \
                                f'{pid})'
                        elif line == 'done':
                            done.add(sock)
                    continue
                selector.unregister(sock)
                if sock not in done:
                    self._tell_others(sock, names[sock])
                    self._stop_process(names[sock],
                                       'stopped (its connection closed)')
                with self._lock:
                    self._peers.pop(sock, None)

    def _tell_others(self, lost_sock: socket.socket, lost: str) -> None:
        with self._lock:
            for conn in self._peers:
                if conn is not lost_sock:
                    try:
                        conn.sendall(f'lost {lost}\n'.encode())
                    except OSError:
                        pass
        time.sleep(0.2)  # let the message leave before this process goes


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(4096)
    except OSError:  # reset by a peer that died: as a close
        return b''


def _lines(conn: socket.socket):
    buffer = b''
    while True:
        data = _recv(conn)
        if not data:
            return
        buffer += data
        *complete, buffer = buffer.split(b'\n')
        for line in complete:
            yield line.decode()


def start_peer_watchdog(store, rank: int, world_size: int,
                        master_addr: str) -> Optional[PeerWatchdog]:
    """Start this rank's watchdog once per process (None for one rank, or
    with ``MMDDP_EXT_PEER_WATCHDOG=0``). A rank that cannot reach rank 0's
    socket (a firewall between nodes) trains without it, with a warning:
    the watchdog only shortens a failure."""
    global _watchdog
    if os.environ.get(WATCHDOG_ENV, '1').strip() == '0':
        return None
    if _watchdog is None and world_size > 1:
        try:
            _watchdog = PeerWatchdog(store, rank, world_size, master_addr)
        except OSError as error:
            from mmengine.logging import print_log
            print_log(
                f'mmddp_ext: rank {rank} could not connect the peer '
                f'watchdog to rank 0 at {master_addr} ({error}); a rank that '
                'dies is then noticed at the next collective, or by srun '
                'with --kill-on-bad-exit=1.',
                logger='current',
                level=30)
    return _watchdog


def announce_planned_exit() -> None:
    """This rank ends its run as planned: its exit alarms no peer."""
    if _watchdog is not None:
        _watchdog.announce_planned_exit()
