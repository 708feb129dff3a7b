package client

import (
	"context"
	"sync"
	"time"
)

// Session is a connection that heals itself. It remembers the topology it
// declared and the consumers it started; when the connection is lost it
// reconnects with backoff, declares the topology again and restarts the
// consumers, whose handlers carry on.
//
// Given a URL that names several nodes (warren://u:p@h1:5680,h2:5690), it
// fails over between them: each reconnect tries every node once, starting
// with the one after the node it lost and wrapping around, so a dead node
// is tried last; rounds that reach none back off from 50 ms to 5 s. Addr
// says which node it is on. On a node that does not hold the topology (a
// separate broker, or a cluster whose queue died with the node) the
// topology is declared afresh, as on a reconnect to the same node.
//
// Publishes are never dropped silently: a publish not confirmed when the
// connection was lost fails with ErrConnectionLost (Publish returns it;
// PublishAsync's confirm handler gets it), and the application decides
// whether to send it again. Deliveries not acked before the loss are
// redelivered by the broker (Redelivered is set); their old tags are dead,
// and acking them is a no-op.
type Session struct {
	url  parsedURL
	opts Options // with Dial's defaults

	mu         sync.Mutex
	conn       *Conn
	ch         *Channel
	ready      chan struct{} // closed while connected; replaced on loss
	steps      []step
	consumers  []*sessionConsumer
	names      map[string]string // server-named queue: first name → current
	confirmFn  func(first, last uint64, err error)
	returnFn   func(Return)
	closed     bool
	done       chan struct{}
	ctx        context.Context // cancelled by Close: ends a reconnect in flight
	cancel     context.CancelFunc
	reconnects int

	// OnReconnect, if set, is called after each successful reconnect.
	OnReconnect func(attempt int)
}

type step struct {
	run func(ctx context.Context, ch *Channel, s *Session) error
}

type sessionConsumer struct {
	queue   string
	opts    ConsumeOptions
	handler func(*Delivery)
	current *Consumer
	handled chan struct{} // closed when the goroutine running handler for current ends
}

// Connect dials (trying the URL's nodes in order, as Dial does) and
// returns a self-healing session.
func Connect(ctx context.Context, url string, opts ...Options) (*Session, error) {
	pu, err := parseURL(url)
	if err != nil {
		return nil, err
	}
	s := &Session{url: pu, names: map[string]string{}, done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if len(opts) > 0 {
		s.opts = opts[0]
	}
	s.opts = s.opts.withDefaults(&pu)
	c, ch, err := s.dial(ctx, 0)
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.install(c, ch)
	go s.watch()
	return s, nil
}

// dial connects to the first node that answers, trying them from first.
func (s *Session) dial(ctx context.Context, first int) (*Conn, *Channel, error) {
	c, err := dialNodes(ctx, &s.url, s.opts, first)
	if err != nil {
		return nil, nil, err
	}
	ch, err := c.Channel(ctx)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, ch, nil
}

// install makes c and ch the session's; false if it was closed meanwhile.
func (s *Session) install(c *Conn, ch *Channel) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conn, s.ch = c, ch
	ch.NotifyConfirm(s.onConfirm)
	ch.NotifyReturn(s.onReturn)
	if s.ready == nil {
		s.ready = make(chan struct{})
	}
	close(s.ready)
	return true
}

func (s *Session) onConfirm(first, last uint64, err error) {
	s.mu.Lock()
	fn := s.confirmFn
	s.mu.Unlock()
	if fn != nil {
		fn(first, last, err)
	}
}

func (s *Session) onReturn(r Return) {
	s.mu.Lock()
	fn := s.returnFn
	s.mu.Unlock()
	if fn != nil {
		fn(r)
	}
}

// watch reconnects after every loss until Close.
func (s *Session) watch() {
	for {
		s.mu.Lock()
		c := s.conn
		s.mu.Unlock()
		select {
		case <-c.Done():
		case <-s.done:
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		s.ready = make(chan struct{})
		s.mu.Unlock()
		// The lost node is tried last: it is the likeliest to be down.
		next := (c.node + 1) % len(s.url.nodes)
		backoff := 50 * time.Millisecond
		for attempt := 1; ; attempt++ {
			select {
			case <-s.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
			ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
			node, err := s.restore(ctx, next)
			cancel()
			if err != nil && node >= 0 {
				// It answered and then failed to restore (a declare or
				// consume refused there): the others first next round.
				next = (node + 1) % len(s.url.nodes)
			}
			if err == nil {
				s.mu.Lock()
				s.reconnects++
				fn := s.OnReconnect
				s.mu.Unlock()
				if fn != nil {
					fn(attempt)
				}
				break
			}
		}
	}
}

// restore dials (from node first), replays the topology and restarts the
// consumers. It returns the node it connected to, or -1 if none answered.
func (s *Session) restore(ctx context.Context, first int) (int, error) {
	c, ch, err := s.dial(ctx, first)
	if err != nil {
		return -1, err
	}
	s.mu.Lock()
	steps := append([]step(nil), s.steps...)
	cons := append([]*sessionConsumer(nil), s.consumers...)
	s.mu.Unlock()
	for _, st := range steps {
		if err := st.run(ctx, ch, s); err != nil {
			c.Close()
			return c.node, err
		}
	}
	for _, sc := range cons {
		if err := s.start(ctx, ch, sc); err != nil {
			c.Close()
			return c.node, err
		}
	}
	if !s.install(c, ch) {
		c.Close() // the session was closed while this one was restored
		return c.node, ErrClosed
	}
	return c.node, nil
}

// channel waits until connected and returns the current channel.
func (s *Session) channel(ctx context.Context) (*Channel, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		ready, ch := s.ready, s.ch
		s.mu.Unlock()
		select {
		case <-ready:
			select {
			case <-ch.c.Done():
				continue // lost; wait for the next connection
			default:
				return ch, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// do runs a topology operation now and records it for reconnects.
func (s *Session) do(ctx context.Context, st step) error {
	ch, err := s.channel(ctx)
	if err != nil {
		return err
	}
	if err := st.run(ctx, ch, s); err != nil {
		return err
	}
	s.mu.Lock()
	s.steps = append(s.steps, st)
	s.mu.Unlock()
	return nil
}

// queueName maps a server-named queue's first name to its current one.
func (s *Session) queueName(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.names[name]; ok {
		return n
	}
	return name
}

// DeclareExchange declares an exchange now and after every reconnect.
func (s *Session) DeclareExchange(ctx context.Context, name, kind string, o ExchangeOptions) error {
	return s.do(ctx, step{run: func(ctx context.Context, ch *Channel, _ *Session) error {
		return ch.DeclareExchange(ctx, name, kind, o)
	}})
}

// DeclareQueue declares a queue now and after every reconnect. A
// server-named queue gets a new name on each connection; the session
// tracks it, so use the name returned here everywhere in the session.
func (s *Session) DeclareQueue(ctx context.Context, name string, o QueueOptions) (QueueInfo, error) {
	// info is the first run's answer. Only that run writes it: it runs
	// before do records the step, so the replays after reconnects, which
	// see firstDone set, happen after it (do and restore pass the step
	// through s.mu) and leave info, which the caller reads, alone.
	var info QueueInfo
	firstDone := false
	first := ""
	err := s.do(ctx, step{run: func(ctx context.Context, ch *Channel, s *Session) error {
		i, err := ch.DeclareQueue(ctx, name, o)
		if err != nil {
			return err
		}
		if name == "" {
			s.mu.Lock()
			if first == "" {
				first = i.Name
			}
			s.names[first] = i.Name
			s.mu.Unlock()
		}
		if !firstDone {
			info, firstDone = i, true
		}
		return nil
	}})
	return info, err
}

// Bind adds a binding now and after every reconnect.
func (s *Session) Bind(ctx context.Context, b Binding) error {
	return s.do(ctx, step{run: func(ctx context.Context, ch *Channel, s *Session) error {
		bb := b
		if !bb.ToExchange {
			bb.Destination = s.queueName(bb.Destination)
		}
		return ch.Bind(ctx, bb)
	}})
}

// Consume runs handler for every delivery from queue, across reconnects,
// on a goroutine of its own: one call at a time, and after a reconnect
// only once the handler is done with what the lost connection delivered.
func (s *Session) Consume(ctx context.Context, queue string, o ConsumeOptions, handler func(*Delivery)) error {
	ch, err := s.channel(ctx)
	if err != nil {
		return err
	}
	sc := &sessionConsumer{queue: queue, opts: o, handler: handler}
	if err := s.start(ctx, ch, sc); err != nil {
		return err
	}
	s.mu.Lock()
	s.consumers = append(s.consumers, sc)
	s.mu.Unlock()
	return nil
}

func (s *Session) start(ctx context.Context, ch *Channel, sc *sessionConsumer) error {
	cs, err := ch.Consume(ctx, s.queueName(sc.queue), sc.opts)
	if err != nil {
		return err
	}
	sc.current = cs
	// One handler call at a time, across reconnects too: this
	// connection's deliveries wait until the handler is done with what
	// the last one had delivered.
	prev, done := sc.handled, make(chan struct{})
	sc.handled = done
	go func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		for d := range cs.Deliveries() {
			sc.handler(d)
		}
	}()
	return nil
}

// Publish sends a message and waits for its confirm. After a connection
// loss it returns ErrConnectionLost for a message that may not have been
// taken; it does not resend by itself.
func (s *Session) Publish(ctx context.Context, exchange string, m Message) error {
	ch, err := s.channel(ctx)
	if err != nil {
		return err
	}
	return ch.Publish(ctx, exchange, m)
}

// PublishAsync queues a message; its confirm goes to the NotifyConfirm
// handler, with ErrConnectionLost for everything unconfirmed at a loss.
func (s *Session) PublishAsync(ctx context.Context, exchange string, m Message) (uint64, error) {
	ch, err := s.channel(ctx)
	if err != nil {
		return 0, err
	}
	return ch.PublishAsync(ctx, exchange, m)
}

// NotifyConfirm sets the confirm handler (see Channel.NotifyConfirm).
// Sequence numbers restart at 1 on each connection.
func (s *Session) NotifyConfirm(fn func(first, last uint64, err error)) {
	s.mu.Lock()
	s.confirmFn = fn
	s.mu.Unlock()
}

// NotifyReturn sets the handler for returned mandatory messages.
func (s *Session) NotifyReturn(fn func(Return)) {
	s.mu.Lock()
	s.returnFn = fn
	s.mu.Unlock()
}

// Addr is the address (host:port) of the node the session is connected
// to, or was last connected to while it reconnects.
func (s *Session) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn.addr
}

// Reconnects is how many times the session has reconnected.
func (s *Session) Reconnects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reconnects
}

// Close ends the session.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.cancel()
	c := s.conn
	s.mu.Unlock()
	return c.Close()
}
