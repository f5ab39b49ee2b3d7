"""An independent ICRC oracle: scapy's RoCEv2 implementation (scapy.contrib.roce).

    python3 scapy_oracle.py gen     prints IPv4 packets (hex, one per line) built
                                    and ICRC'd by scapy
    python3 scapy_oracle.py check   reads IPv4 packets (hex lines) on stdin and
                                    prints "ok" or "bad <scapy's icrc>" for each

Used by tests/icrc_oracle.rs (rocev2's codec against scapy, both ways).
"""
import struct
import sys

from scapy.all import IP, UDP, Raw, raw
from scapy.contrib.roce import AETH, BTH


def send_packet(opcode, qpn, psn, payload, imm=None, ip_id=0, df=True, tos=0, ttl=64, sport=49152):
    pad = (4 - len(payload) % 4) % 4
    body = (struct.pack("!I", imm) if imm is not None else b"") + payload + b"\0" * pad
    return (IP(src="10.0.0.20", dst="10.0.0.1", id=ip_id, flags="DF" if df else 0, tos=tos, ttl=ttl)
            / UDP(sport=sport, dport=4791)
            / BTH(opcode=opcode, dqpn=qpn, psn=psn, ackreq=1, padcount=pad)
            / Raw(body))


def gen():
    cases = [
        send_packet(0x05, 0x123456, 0xabcdef, bytes(range(256)) * 16, imm=0x00000305),
        send_packet(0x05, 0x000011, 0, b"hello", imm=0xdeadbeef, ip_id=0x1234, df=False, tos=0x10, ttl=3),
        send_packet(0x04, 0x000011, 0xffffff, b""),
        send_packet(0x00, 0x000022, 7, bytes(4096)),
        send_packet(0x01, 0x000022, 8, bytes([0x5a]) * 4096, sport=1234),
        send_packet(0x03, 0x000022, 9, b"last!", imm=7),
    ]
    for n in (1, 2, 3, 5, 6, 7):
        cases.append(send_packet(0x05, 0x33, n, bytes(range(n)), imm=n))
    ack = (IP(src="10.0.0.1", dst="10.0.0.20", id=0, flags="DF")
           / UDP(sport=4791, dport=4791)
           / BTH(opcode=0x11, dqpn=0x22, psn=0x10)
           / AETH(syndrome=0x1f, msn=5))
    cases.append(ack)
    for c in cases:
        print(raw(c).hex())


def check():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        pkt = IP(bytes.fromhex(line))
        carried = pkt[BTH].icrc
        fresh = pkt.copy()
        fresh[BTH].icrc = None
        recomputed = IP(raw(fresh))[BTH].icrc
        print("ok" if carried == recomputed else f"bad {recomputed:#010x} carried {carried:#010x}")


if __name__ == "__main__":
    {"gen": gen, "check": check}[sys.argv[1]]()
