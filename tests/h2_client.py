"""A raw HTTP/2 (h2c) client for the hostile-input tests: sends requests whose pseudo-headers and
header values hold any bytes, on one multiplexed connection, and reports what came back.

Built on the `h2` package (python-hyper), a real HTTP/2 implementation, with its outbound header
validation turned off: Rust's `http` types refuse the bytes these tests must send, and HTTP/1 codecs
refuse them before any filter runs, so only an HTTP/2 client reaches the plugin with them.

stdin:  {"authority": "127.0.0.1:PORT", "requests": [{"path": HEX, "headers": [[NAME, HEX], ...]}]}
stdout: [[STATUS, UPSTREAM], ...] in request order. STATUS is 0 when the stream was reset or never
        answered; UPSTREAM is true when Envoy got the answer from an upstream host (it adds
        x-envoy-upstream-service-time), false for a reply Envoy or a filter made itself.
"""

import json
import socket
import sys

import h2.config
import h2.connection
import h2.events

TIMEOUT_S = 20


def main():
    spec = json.load(sys.stdin)
    host, port = spec["authority"].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    config = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
        validate_inbound_headers=False,
    )
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())

    streams = {}
    for index, request in enumerate(spec["requests"]):
        stream_id = conn.get_next_available_stream_id()
        headers = [
            (b":method", b"GET"),
            (b":scheme", b"http"),
            (b":authority", spec["authority"].encode()),
            (b":path", bytes.fromhex(request["path"])),
        ]
        headers += [(name.encode(), bytes.fromhex(value)) for name, value in request.get("headers", [])]
        conn.send_headers(stream_id, headers, end_stream=True)
        streams[stream_id] = index
        sock.sendall(conn.data_to_send())

    statuses = [[0, False] for _ in spec["requests"]]
    open_streams = set(streams)
    while open_streams:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            break
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                for name, value in event.headers:
                    if name == b":status":
                        statuses[streams[event.stream_id]][0] = int(value)
                    elif name == b"x-envoy-upstream-service-time":
                        statuses[streams[event.stream_id]][1] = True
            elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                open_streams.discard(event.stream_id)
            elif isinstance(event, h2.events.DataReceived):
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.ConnectionTerminated):
                open_streams.clear()
        pending = conn.data_to_send()
        if pending:
            sock.sendall(pending)
    sock.close()
    json.dump(statuses, sys.stdout)


if __name__ == "__main__":
    main()
