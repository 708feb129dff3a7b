package wire

// ReadMessage reads one message in AppendMessage's layout from the front of
// b into m, as views of b, and returns the bytes after it; ok is false when
// b is too short to hold one. It does not validate (flag bits, property
// block): it is for bytes this process or its log wrote, which were
// validated when published and are checksummed where stored (a durable
// queue's log keeps each message in this layout, design/replication.md
// §9). It allocates nothing.
func ReadMessage(b []byte, m *Message) (rest []byte, ok bool) {
	r := reader{b: b}
	*m = r.message()
	if r.err != nil {
		*m = Message{}
		return b, false
	}
	return b[r.off:], true
}
