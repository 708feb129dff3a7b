package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// The one binary encoding of metadata commands and of the metadata
// snapshot. Integers are little-endian and fixed-width, strings a u32
// length and their bytes, tables as the wire encodes them (u32 length,
// entries), booleans one byte 0 or 1. Every encoding starts with its
// version; a decoder refuses a version it does not know, a length that
// runs past the end, a flag it does not know and trailing bytes, and never
// panics.

// MetaCommandVersion is the version byte of an encoded MetaCommand.
// Version 2 adds a queue declare's home node and incarnation after its
// declaration, and MetaDropHome (homed.go); a command that has neither
// is still written as version 1, and versions 1 and 2 read.
const MetaCommandVersion = 2

// MetaSnapshotVersion is the version byte of a metadata snapshot. Version
// 2 adds the users after the bindings, version 3 the permissions after
// them, version 4 the virtual hosts after those, version 5 each queue's
// placement (its replicas and preferred leader, after its declaring user:
// an older snapshot's durable queues are placed as it is restored, in
// name order, as if declared so), version 6 each placed queue's origin
// and target after its preferred leader (moves.go; a version 5 queue's
// origin is its replicas, and it has no target); versions 1 to 6 still
// read (with "/" the only vhost); version 7 the nodes whose copy is being
// rebuilt after the target, version 8 each queue's home node and
// incarnation after those (homed.go; 0 and 0 in an older snapshot: a
// queue with no home).
const MetaSnapshotVersion = 8

// maxMetaString bounds a string in an encoded command or snapshot (names
// are at most 255 bytes; users and routing keys are bounded by the frame
// they came in).
const maxMetaString = 1 << 20

// maxMetaCommand bounds an encoded command a cluster proposes (before
// any machine checks it): well past what a change the machine takes can
// be (a binding's arguments: MaxBindingArgsLen; an admin request body:
// 1 MiB), well under an entry the log takes (segment.MaxEntry).
const maxMetaCommand = 4 << 20

// AppendMetaCommand appends c's encoding to dst.
func AppendMetaCommand(dst []byte, c *MetaCommand) []byte {
	v := byte(1)
	if c.Op == MetaDropHome || c.Op == MetaDeclareQueue && c.Home != 0 {
		v = 2
	}
	dst = append(dst, v, byte(c.Op))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(c.NowMs))
	dst = appendMetaStr(dst, c.User)
	dst = append(dst, flagByte(c.Admin))
	dst = binary.LittleEndian.AppendUint64(dst, c.Conn)
	switch c.Op {
	case MetaDeclareExchange:
		dst = appendExchangeDecl(dst, &c.Exchange, c.Exchange.Passive)
	case MetaDeleteExchange:
		dst = appendMetaStr(dst, c.Delete.Name)
		dst = append(dst, flagByte(c.Delete.IfUnused))
	case MetaDeclareQueue:
		dst = appendQueueDecl(dst, &c.Queue, c.Queue.Passive, c.Generated)
		if v == 2 {
			dst = binary.LittleEndian.AppendUint64(dst, c.Home)
			dst = binary.LittleEndian.AppendUint64(dst, c.HomeInc)
		}
	case MetaDropHome:
		dst = binary.LittleEndian.AppendUint64(dst, c.Home)
		dst = binary.LittleEndian.AppendUint64(dst, c.HomeInc)
		dst = append(dst, flagByte(c.HomeUpTo))
	case MetaDeleteQueue:
		dst = appendMetaStr(dst, c.Queue.Name)
		dst = binary.LittleEndian.AppendUint64(dst, c.QueueID)
	case MetaBind:
		dst = appendBinding(dst, queue.Binding{Source: c.Bind.Source, Destination: c.Bind.Destination,
			ToExchange: c.Bind.ToExchange, Key: c.Bind.RoutingKey, Args: c.Bind.Args})
		dst = append(dst, flagByte(c.Bind.Unbind))
	case MetaPutUser:
		dst = appendMetaUser(dst, &c.Account)
		dst = append(dst, flagByte(c.IfAbsent))
	case MetaDeleteUser:
		dst = appendMetaStr(dst, c.Account.Name)
	case MetaSetPermission, MetaClearPermission:
		dst = appendMetaPermission(dst, &c.Permission)
	case MetaPutVhost:
		dst = appendMetaVhost(dst, &c.Vhost)
		dst = append(dst, flagByte(c.IfAbsent))
	case MetaDeleteVhost:
		dst = appendMetaStr(dst, c.Vhost.Name)
	case MetaPlaceReplicas:
		dst = appendNodes(dst, c.Replicas)
	case MetaReplicasMoved, MetaRebuildReplica, MetaRebuildDone:
		dst = appendMetaStr(dst, c.Queue.Name)
		dst = binary.LittleEndian.AppendUint64(dst, c.QueueID)
		dst = appendNodes(dst, c.Replicas)
	}
	return dst
}

// appendNodes appends a node list: n u8 | n × id u64.
func appendNodes(dst []byte, ns []uint64) []byte {
	dst = append(dst, byte(len(ns)))
	for _, n := range ns {
		dst = binary.LittleEndian.AppendUint64(dst, n)
	}
	return dst
}

// nodes reads a node list of at most maxReplicas ids.
func (r *metaReader) nodes(what string) []uint64 {
	k := int(r.u8())
	if r.err != nil {
		return nil
	}
	if k > maxReplicas {
		r.fail(what + ": " + strconv.Itoa(k) + " replicas")
		return nil
	}
	var ns []uint64
	for range k {
		ns = append(ns, r.u64())
	}
	return ns
}

// DecodeMetaCommand decodes one encoded MetaCommand (all of b).
func DecodeMetaCommand(b []byte) (MetaCommand, error) {
	r := metaReader{b: b}
	var c MetaCommand
	v := r.u8()
	if r.err == nil && (v < 1 || v > MetaCommandVersion) {
		return c, fmt.Errorf("metadata command version %d: this broker reads versions 1 to %d (upgrade it)", v, MetaCommandVersion)
	}
	c.Op = MetaOp(r.u8())
	if r.err == nil && v == 2 && c.Op != MetaDeclareQueue && c.Op != MetaDropHome {
		r.fail("operation " + strconv.Itoa(int(c.Op)) + " is written as version 1")
	}
	c.NowMs = int64(r.u64())
	c.User = r.str()
	c.Admin = r.flag()
	c.Conn = r.u64()
	switch c.Op {
	case MetaDeclareExchange:
		c.Exchange = r.exchangeDecl()
	case MetaDeleteExchange:
		c.Delete.Name = r.str()
		c.Delete.IfUnused = r.flag()
	case MetaDeclareQueue:
		c.Queue, c.Generated = r.queueDecl()
		if v >= 2 {
			c.Home, c.HomeInc = r.u64(), r.u64()
			if r.err == nil && c.Home == 0 {
				r.fail("a version 2 queue declare without its home node")
			}
		}
	case MetaDropHome:
		if v < 2 && r.err == nil {
			r.fail("home nodes are dropped from command version 2")
		}
		c.Home, c.HomeInc = r.u64(), r.u64()
		// The flag came after the first entries were written (by
		// b09a9d2..4334fcd, without it): missing, it is false.
		if r.err == nil && len(r.b) > 0 {
			c.HomeUpTo = r.flag()
		}
	case MetaDeleteQueue:
		c.Queue.Name = r.str()
		c.QueueID = r.u64()
	case MetaBind:
		b := r.binding()
		c.Bind = wire.Bind{Source: b.Source, Destination: b.Destination, ToExchange: b.ToExchange, RoutingKey: b.Key, Args: b.Args}
		c.Bind.Unbind = r.flag()
	case MetaNodeUp: // no operands
	case MetaPutUser:
		c.Account = r.metaUser()
		c.IfAbsent = r.flag()
	case MetaDeleteUser:
		c.Account.Name = r.str()
	case MetaSetPermission, MetaClearPermission:
		c.Permission = r.metaPermission()
	case MetaPutVhost:
		c.Vhost = r.metaVhost()
		c.IfAbsent = r.flag()
	case MetaDeleteVhost:
		c.Vhost.Name = r.str()
	case MetaPlaceReplicas:
		c.Replicas = r.nodes("nodes to drain")
	case MetaReplicasMoved, MetaRebuildReplica, MetaRebuildDone:
		c.Queue.Name = r.str()
		c.QueueID = r.u64()
		c.Replicas = r.nodes("replicas moved")
	default:
		if r.err == nil {
			r.fail("unknown metadata operation " + strconv.Itoa(int(c.Op)))
		}
	}
	if err := r.end(); err != nil {
		return MetaCommand{}, err
	}
	return c, nil
}

func flagByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

func flagBits(vs ...bool) byte {
	var f byte
	for i, v := range vs {
		if v {
			f |= 1 << i
		}
	}
	return f
}

func appendMetaStr(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s)))
	return append(dst, s...)
}

func appendExchangeDecl(dst []byte, d *wire.ExchangeDeclare, passive bool) []byte {
	dst = appendMetaStr(dst, d.Name)
	dst = append(dst, byte(d.Kind), flagBits(d.Durable, d.AutoDelete, d.Internal, passive))
	dst = appendMetaStr(dst, d.Alternate)
	return wire.AppendTable(dst, d.Args)
}

func appendQueueDecl(dst []byte, d *wire.QueueDeclare, passive, generated bool) []byte {
	dst = appendMetaStr(dst, d.Name)
	dst = append(dst, flagBits(d.Durable, d.Exclusive, d.AutoDelete, passive, generated))
	return wire.AppendTable(dst, d.Args)
}

func appendBinding(dst []byte, b queue.Binding) []byte {
	dst = appendMetaStr(dst, b.Source)
	dst = appendMetaStr(dst, b.Destination)
	dst = append(dst, flagByte(b.ToExchange))
	dst = appendMetaStr(dst, b.Key)
	return wire.AppendTable(dst, b.Args)
}

// metaReader reads the encoding; the first error sticks and every read
// after it returns zero values.
type metaReader struct {
	b   []byte
	err error
}

func (r *metaReader) fail(msg string) {
	if r.err == nil {
		r.err = errors.New("metadata encoding: " + msg)
	}
	r.b = nil
}

func (r *metaReader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.fail(what + " runs past the end")
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *metaReader) u8() byte {
	p := r.take(1, "a byte")
	if p == nil {
		return 0
	}
	return p[0]
}

func (r *metaReader) u32() uint32 {
	p := r.take(4, "a u32")
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(p)
}

func (r *metaReader) u64() uint64 {
	p := r.take(8, "a u64")
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(p)
}

func (r *metaReader) flag() bool {
	v := r.u8()
	if v > 1 {
		r.fail("a boolean is " + strconv.Itoa(int(v)) + ", not 0 or 1")
	}
	return v == 1
}

// flags reads a flag byte with n defined bits.
func (r *metaReader) flags(n uint) byte {
	v := r.u8()
	if v>>n != 0 {
		r.fail("unknown flag bits " + strconv.Itoa(int(v)))
	}
	return v
}

func (r *metaReader) str() string {
	n := r.u32()
	if n > maxMetaString {
		r.fail("a string of " + strconv.FormatUint(uint64(n), 10) + " bytes")
		return ""
	}
	return string(r.take(int(n), "a string"))
}

// legacyMetaTableDepth is the deepest nesting (levels, the outer table
// counted, as wire.MaxTableDepth counts) a logged table may have: the
// AMQP front's bound (netio/amqp maxTableDepth: 16 levels below the
// outer table), which tables written before storableArgs could reach.
const legacyMetaTableDepth = 17

func (r *metaReader) table() wire.Table {
	n := r.u32()
	raw := r.take(int(n), "a table")
	if r.err != nil || len(raw) == 0 {
		return nil
	}
	// Up to AMQP's nesting: before storableArgs, an AMQP binding's
	// arguments were logged nested that deep, and a log that holds one
	// must still recover.
	t, err := wire.DecodeTableNested(raw, legacyMetaTableDepth)
	if err != nil {
		r.fail("a table: " + err.Error())
		return nil
	}
	return t
}

func (r *metaReader) exchangeDecl() wire.ExchangeDeclare {
	var d wire.ExchangeDeclare
	d.Name = r.str()
	d.Kind = wire.ExchangeKind(r.u8())
	if r.err == nil && (d.Kind < wire.ExchangeDirect || d.Kind > wire.ExchangeConsistentHash) {
		r.fail("unknown exchange kind " + strconv.Itoa(int(d.Kind)))
	}
	f := r.flags(4)
	d.Durable, d.AutoDelete, d.Internal, d.Passive = f&1 != 0, f&2 != 0, f&4 != 0, f&8 != 0
	d.Alternate = r.str()
	d.Args = r.table()
	return d
}

func (r *metaReader) queueDecl() (wire.QueueDeclare, bool) {
	var d wire.QueueDeclare
	d.Name = r.str()
	f := r.flags(5)
	d.Durable, d.Exclusive, d.AutoDelete, d.Passive = f&1 != 0, f&2 != 0, f&4 != 0, f&8 != 0
	d.Args = r.table()
	return d, f&16 != 0
}

func (r *metaReader) binding() queue.Binding {
	var b queue.Binding
	b.Source = r.str()
	b.Destination = r.str()
	b.ToExchange = r.flag()
	b.Key = r.str()
	b.Args = r.table()
	return b
}

func (r *metaReader) end() error {
	if r.err == nil && len(r.b) > 0 {
		r.fail(strconv.Itoa(len(r.b)) + " trailing bytes")
	}
	return r.err
}

// Snapshot encodes the whole state, deterministically: the same state
// gives the same bytes (exchanges and queues by name, bindings by key).
func (m *Meta) Snapshot() []byte { return m.snapshotAt(MetaSnapshotVersion) }

// snapshotAt encodes the state in snapshot version v, 4 or 5 (tests
// make version 4 snapshots with it: 4 has no placement).
func (m *Meta) snapshotAt(v byte) []byte {
	dst := []byte{v}
	dst = binary.LittleEndian.AppendUint64(dst, m.nextID)
	exs := m.Exchanges()
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(exs)))
	for i := range exs {
		dst = appendExchangeDecl(dst, &exs[i], false)
		dst = appendMetaStr(dst, m.exchanges[exs[i].Name].by)
	}
	qs := m.Queues()
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(qs)))
	for i := range qs {
		q := &qs[i]
		dst = binary.LittleEndian.AppendUint64(dst, q.ID)
		dst = appendQueueDecl(dst, &q.Decl, false, false)
		dst = binary.LittleEndian.AppendUint64(dst, q.Exclusive)
		dst = appendMetaStr(dst, q.DeclaredBy)
		if v >= 5 {
			dst = appendNodes(dst, q.Replicas)
			dst = binary.LittleEndian.AppendUint64(dst, q.Leader)
		}
		if v >= 6 {
			dst = appendNodes(dst, q.Origin)
			dst = appendNodes(dst, q.Target)
		}
		if v >= 7 {
			dst = appendNodes(dst, q.Rebuild)
		}
		if v >= 8 {
			dst = binary.LittleEndian.AppendUint64(dst, q.Home)
			dst = binary.LittleEndian.AppendUint64(dst, q.HomeInc)
		}
	}
	bs := m.sortedBindings()
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(bs)))
	for _, b := range bs {
		dst = appendBinding(dst, b.b)
		dst = appendMetaStr(dst, b.by)
	}
	us := m.Users()
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(us)))
	for i := range us {
		dst = appendMetaUser(dst, &us[i])
	}
	ps := m.Permissions()
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(ps)))
	for i := range ps {
		dst = appendMetaPermission(dst, &ps[i])
	}
	vs := m.Vhosts()
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(vs)))
	for i := range vs {
		dst = appendMetaVhost(dst, &vs[i])
	}
	if v >= 6 {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m.draining)))
		for _, id := range m.draining {
			dst = binary.LittleEndian.AppendUint64(dst, id)
		}
	}
	return dst
}

// Restore replaces the state with a snapshot's. On an error the state is
// unchanged.
func (m *Meta) Restore(snap []byte) error {
	n := &Meta{shards: m.shards, limits: m.limits, nodes: m.nodes}
	n.reset()
	r := metaReader{b: snap}
	v := r.u8()
	if r.err == nil && (v < 1 || v > MetaSnapshotVersion) {
		return fmt.Errorf("metadata snapshot version %d: this broker reads versions 1 to %d (upgrade it)", v, MetaSnapshotVersion)
	}
	n.nextID = r.u64()
	if r.err == nil && (n.nextID == 0 || n.nextID > math.MaxUint32) {
		r.fail("next queue id " + strconv.FormatUint(n.nextID, 10) + " out of range")
	}
	for i, c := int(r.u32()), 0; c < i && r.err == nil; c++ {
		d := r.exchangeDecl()
		by := r.str()
		if r.err != nil {
			break
		}
		if _, dup := n.exchanges[d.Name]; dup || d.Passive {
			r.fail("exchange " + strconv.Quote(d.Name) + " twice or passive")
			break
		}
		n.exchanges[d.Name] = &metaExchange{decl: d, by: by}
	}
	ids := map[uint64]bool{}
	for i, c := int(r.u32()), 0; c < i && r.err == nil; c++ {
		id := r.u64()
		d, gen := r.queueDecl()
		excl := r.u64()
		by := r.str()
		var replicas, origin, target, rebuild []uint64
		var leader, home, homeInc uint64
		if v >= 5 {
			replicas = r.nodes("queue " + strconv.Quote(d.Name))
			leader = r.u64()
			origin = replicas
		}
		if v >= 6 {
			origin = r.nodes("queue " + strconv.Quote(d.Name) + "'s origin")
			target = r.nodes("queue " + strconv.Quote(d.Name) + "'s target")
		}
		if v >= 7 {
			rebuild = r.nodes("queue " + strconv.Quote(d.Name) + "'s copies to rebuild")
		}
		if v >= 8 {
			home, homeInc = r.u64(), r.u64()
		}
		if r.err != nil {
			break
		}
		if home != 0 && placed(&d) || home == 0 && homeInc != 0 {
			r.fail("queue " + strconv.Quote(d.Name) + ": home node " + strconv.FormatUint(home, 10) + " (incarnation " + strconv.FormatUint(homeInc, 10) + ") for a queue that cannot have it")
			break
		}
		if !placedOK(&d, replicas, leader, v) || !movesOK(replicas, origin, target, leader) || !rebuildOK(replicas, target, rebuild) {
			r.fail("queue " + strconv.Quote(d.Name) + ": replicas " + fmt.Sprint(replicas) + " (origin " + fmt.Sprint(origin) + ", target " + fmt.Sprint(target) + ") with preferred leader " + strconv.FormatUint(leader, 10) + " are not a placement")
			break
		}
		if _, err := wire.ParseQueueArgs(d.Args); err != nil {
			r.fail("queue " + strconv.Quote(d.Name) + ": " + err.Error())
			break
		}
		if _, dup := n.queues[d.Name]; dup || d.Passive || gen || id == 0 || id > math.MaxUint32 || ids[id] {
			r.fail("queue " + strconv.Quote(d.Name) + " twice, passive, or with id " + strconv.FormatUint(id, 10) + " taken or out of range")
			break
		}
		ids[id] = true
		n.ids[id] = struct{}{}
		q := &metaQueue{id: id, decl: d, exclusive: excl, by: by, replicas: replicas, leader: leader, origin: origin, target: target, rebuild: rebuild,
			home: home, homeInc: homeInc}
		n.queues[d.Name] = q
		n.count(q, 1)
		n.countQueue(d.Name, 1)
		if excl != 0 {
			n.exclusive[excl]++
		}
	}
	if v < 5 && r.err == nil {
		// Placed as if declared in name order (deterministic: every node
		// restoring this snapshot places them alike).
		for _, mq := range n.Queues() {
			if q := n.queues[mq.Name]; placed(&q.decl) {
				n.place(q, int(mq.Args.Replicas))
			}
		}
	}
	for i, c := int(r.u32()), 0; c < i && r.err == nil; c++ {
		b := r.binding()
		by := r.str()
		if r.err != nil {
			break
		}
		_, srcOK := n.exchanges[b.Source]
		dstOK := n.queues[b.Destination] != nil
		if b.ToExchange {
			_, dstOK = n.exchanges[b.Destination]
		}
		key := bindKey(b)
		if !srcOK || !dstOK || n.bindings[key] != nil {
			r.fail("binding from " + strconv.Quote(b.Source) + " to " + strconv.Quote(b.Destination) + ": an end is missing or it is listed twice")
			break
		}
		n.link(&metaBinding{key: key, b: b, by: by})
	}
	if v >= 2 {
		for i, c := int(r.u32()), 0; c < i && r.err == nil; c++ {
			u := r.metaUser()
			if r.err != nil {
				break
			}
			if _, dup := n.users[u.Name]; dup || u.Name == "" || u.PasswordHash == "" {
				r.fail("user " + strconv.Quote(u.Name) + " twice, unnamed or without a hash")
				break
			}
			n.users[u.Name] = &u
		}
	}
	if v >= 3 {
		for i, c := int(r.u32()), 0; c < i && r.err == nil; c++ {
			p := r.metaPermission()
			if r.err != nil {
				break
			}
			k := permKey(p.Vhost, p.User)
			if _, dup := n.perms[k]; dup || n.users[p.User] == nil {
				r.fail("permissions of user " + strconv.Quote(p.User) + " twice or without the user")
				break
			}
			n.perms[k] = &p
		}
	}
	if v >= 4 {
		for i, c := int(r.u32()), 0; c < i && r.err == nil; c++ {
			vh := r.metaVhost()
			if r.err != nil {
				break
			}
			if checkVhostName(vh.Name) != nil {
				r.fail("virtual host " + strconv.Quote(vh.Name) + ": not a vhost name")
				break
			}
			n.vhosts[vh.Name] = &vh
		}
	}
	if v >= 6 {
		for i, c := int(r.u32()), 0; c < i && r.err == nil; c++ {
			id := r.u64()
			if r.err == nil && (id == 0 || len(n.draining) > 0 && id <= n.draining[len(n.draining)-1]) {
				r.fail("draining node " + strconv.FormatUint(id, 10) + " out of order")
			}
			n.draining = append(n.draining, id)
		}
	}
	if err := r.end(); err != nil {
		return err
	}
	*m = *n
	return nil
}

// MetaEffectSink is what applies the metadata state machine's effects at
// run time (the broker's topology: routing, shards).
type MetaEffectSink interface {
	ApplyMetaEffects(effs []MetaEffect)
}

// MetaMachine applies encoded metadata commands to a Meta and hands their
// effects to a sink: the replication.StateMachine of the metadata group.
type MetaMachine struct {
	Meta    *Meta
	Sink    MetaEffectSink // nil: effects are dropped
	Applied uint64         // index of the last command applied or restored
}

// Apply decodes one command, applies it and returns its MetaResult. An
// error means the bytes are no command this version knows.
func (mm *MetaMachine) Apply(index uint64, cmd []byte) (any, error) {
	c, err := DecodeMetaCommand(cmd)
	if err != nil {
		return nil, err
	}
	res, effs := mm.Meta.Apply(&c)
	mm.Applied = index
	if mm.Sink != nil && len(effs) > 0 {
		mm.Sink.ApplyMetaEffects(effs)
	}
	return res, nil
}

// Snapshot encodes the state after the last command applied.
func (mm *MetaMachine) Snapshot() ([]byte, error) { return mm.Meta.Snapshot(), nil }

// Restore replaces the state with a snapshot's and hands the sink the
// effects that turn the old state into the new one.
func (mm *MetaMachine) Restore(index uint64, snap []byte) error {
	old := *mm.Meta
	if err := mm.Meta.Restore(snap); err != nil {
		return err
	}
	mm.Applied = index
	if effs := diffMeta(&old, mm.Meta); mm.Sink != nil && len(effs) > 0 {
		mm.Sink.ApplyMetaEffects(effs)
	}
	return nil
}

// diffMeta lists the effects that turn state a into state b: removals
// first (an exchange's or a queue's removal takes its bindings along),
// then creations, then the bindings b has that survived or new ends lack.
func diffMeta(a, b *Meta) []MetaEffect {
	var effs []MetaEffect
	exGone := map[string]bool{}
	for _, d := range a.Exchanges() {
		if nd, ok := b.exchanges[d.Name]; !ok || !sameExchange(&d, &nd.decl) {
			exGone[d.Name] = true
			effs = append(effs, MetaEffect{Kind: EffExchangeRemoved, Exchange: queue.Exchange{Name: d.Name}})
		}
	}
	qGone := map[string]bool{}
	for _, q := range a.Queues() {
		if nq, ok := b.queues[q.Name]; !ok || nq.id != q.ID {
			qGone[q.Name] = true
			effs = append(effs, MetaEffect{Kind: EffQueueRemoved, Queue: MetaQueue{ID: q.ID, Name: q.Name}})
		}
	}
	for _, ob := range a.sortedBindings() {
		if b.bindings[ob.key] == nil && !exGone[ob.b.Source] && !(ob.b.ToExchange && exGone[ob.b.Destination]) && !(!ob.b.ToExchange && qGone[ob.b.Destination]) {
			effs = append(effs, MetaEffect{Kind: EffBindingRemoved, Binding: ob.b})
		}
	}
	for _, d := range b.Exchanges() {
		if _, ok := a.exchanges[d.Name]; !ok || exGone[d.Name] {
			effs = append(effs, MetaEffect{Kind: EffExchangeCreated, Exchange: exchangeOf(&d)})
		}
	}
	for _, q := range b.Queues() {
		if _, ok := a.queues[q.Name]; !ok || qGone[q.Name] {
			effs = append(effs, MetaEffect{Kind: EffQueueCreated, Queue: q, Shard: b.ShardOf(q.Name)})
		} else if o := a.queues[q.Name]; !slices.Equal(o.replicas, q.Replicas) || !slices.Equal(o.target, q.Target) || o.leader != q.Leader || !slices.Equal(o.rebuild, q.Rebuild) {
			effs = append(effs, MetaEffect{Kind: EffQueueReplicas, Queue: q})
		}
	}
	for _, nb := range b.sortedBindings() {
		x := &nb.b
		if a.bindings[nb.key] == nil || exGone[x.Source] || (x.ToExchange && exGone[x.Destination]) || (!x.ToExchange && qGone[x.Destination]) {
			effs = append(effs, MetaEffect{Kind: EffBindingAdded, Binding: nb.b})
		}
	}
	effs = append(effs, diffUsers(a, b)...)
	return append(effs, diffVhosts(a, b)...)
}

func sameExchange(a, b *wire.ExchangeDeclare) bool {
	return a.Kind == b.Kind && a.Durable == b.Durable && a.AutoDelete == b.AutoDelete && a.Internal == b.Internal &&
		a.Alternate == b.Alternate && sameArgs(a.Args, b.Args)
}
