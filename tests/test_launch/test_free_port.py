"""free_port draws launcher ports where no outgoing connection can take
them between the draw and the launcher's own bind."""
import socket

from mmddp_ext.launch.rank_launcher import ephemeral_port_range
from mmddp_ext.testing import free_port


def test_ports_are_bindable_and_outside_the_ephemeral_range():
    ephemeral = ephemeral_port_range()
    ports = [free_port() for _ in range(50)]
    assert not [p for p in ports if p in ephemeral], ephemeral
    assert len(set(ports)) > 40  # drawn at random, not one fixed port
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', ports[-1]))


def test_control_connections_and_bind_zero_share_the_ephemeral_range():
    """The collision the draw avoids: the local port of an outgoing
    connection (gloo opens one per rank pair) and a ``bind(0)`` port (the
    old free_port) come from the same range."""
    ephemeral = ephemeral_port_range()
    with socket.socket() as server, socket.socket() as client, \
            socket.socket() as bound:
        server.bind(('127.0.0.1', free_port()))
        server.listen()
        client.connect(server.getsockname())
        bound.bind(('127.0.0.1', 0))
        assert client.getsockname()[1] in ephemeral
        assert bound.getsockname()[1] in ephemeral
