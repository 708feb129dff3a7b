package broker

import (
	"testing"

	"github.com/warren-mq/warren/wire"
)

// add copies a message's parts to the end of a.Buf and returns the stored
// message viewing them: a test's batch of messages sharing one arena, as a
// publish batch's do. Every add comes before any shard sees the arena.
func (a *Arena) add(exchange, key, props, body []byte, flags wire.MessageFlags, priority uint8) *StoredMsg {
	o := len(a.Buf)
	a.Buf = append(append(append(append(a.Buf, exchange...), key...), props...), body...)
	i, j, k := o+len(exchange), o+len(exchange)+len(key), o+len(exchange)+len(key)+len(props)
	m := a.Msg(a.Buf[o:i], a.Buf[i:j], a.Buf[j:k], a.Buf[k:], flags, priority)
	return &m
}

// TestStoredMsgViewsItsArena: a stored message's parts read back as given,
// capped (an append to one does not write into the next), from an arena
// that holds other bytes around them; a part outside the arena panics.
func TestStoredMsgViewsItsArena(t *testing.T) {
	buf := []byte("..exKEYpropsBODY..")
	ar := &Arena{Buf: buf}
	m := ar.Msg(buf[2:4], buf[4:7], buf[7:12], buf[12:16], wire.Persistent, 3)
	if string(m.Exchange()) != "ex" || string(m.RoutingKey()) != "KEY" || string(m.Props()) != "props" || string(m.Body()) != "BODY" ||
		m.Flags != wire.Persistent || m.Priority != 3 || m.Arena != ar {
		t.Fatalf("read back %q %q %q %q %v %d", m.Exchange(), m.RoutingKey(), m.Props(), m.Body(), m.Flags, m.Priority)
	}
	_ = append(m.RoutingKey(), 'x')
	if string(m.Props()) != "props" {
		t.Fatalf("an append to the key wrote into the properties: %q", m.Props())
	}
	empty := ar.Msg(nil, []byte{}, nil, nil, 0, 0)
	if len(empty.Exchange()) != 0 || len(empty.Body()) != 0 {
		t.Fatal("empty parts read back non-empty")
	}
	n := NewStoredMsg([]byte("x"), []byte("k"), nil, []byte("body"), 0, 1)
	if string(n.Exchange()) != "x" || string(n.RoutingKey()) != "k" || len(n.Props()) != 0 || string(n.Body()) != "body" || len(n.Arena.Buf) != 6 {
		t.Fatalf("NewStoredMsg: %q %q %q %q in %d bytes", n.Exchange(), n.RoutingKey(), n.Props(), n.Body(), len(n.Arena.Buf))
	}
	for name, p := range map[string][]byte{"elsewhere": []byte("other"), "past the end": buf[15:18]} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("a part %s did not panic", name)
				}
			}()
			ar2 := &Arena{Buf: buf[:16]}
			ar2.Msg(nil, nil, nil, p, 0, 0)
		}()
	}
}
