package broker

import (
	"context"
	"strings"
)

// This file is the runtime side of the virtual hosts the metadata state
// machine keeps (issue 15; the naming: vhost_names.go).

// vhostsChangedLocked tells the onVhosts hooks of the vhost effects in
// effs (mu held).
func (t *topology) vhostsChangedLocked(effs []MetaEffect) {
	if len(t.onVhosts) == 0 {
		return
	}
	var removed []string
	for _, e := range effs {
		if e.Kind == EffVhostRemoved {
			removed = append(removed, e.Name)
		}
	}
	vs := t.meta.Vhosts()
	for _, fn := range t.onVhosts {
		fn(vs, removed)
	}
}

// OnVhosts adds a function told of every change to the vhosts: all of
// them, and the names of those removed (a front closes their
// connections). It is called with the topology's lock held: it must not
// call back into the broker, nor block. It is called once now.
func (b *Broker) OnVhosts(fn func(vhosts []MetaVhost, removed []string)) {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onVhosts = append(t.onVhosts, fn)
	fn(t.meta.Vhosts(), nil)
}

// Vhosts lists the vhosts, by name.
func (b *Broker) Vhosts() []MetaVhost {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.meta.Vhosts()
}

// Vhost is one vhost, if it exists.
func (b *Broker) Vhost(name string) (MetaVhost, bool) {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.meta.Vhost(name)
}

// VhostQueues counts a vhost's queues.
func (b *Broker) VhostQueues(name string) int {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.meta.VhostQueues(name)
}

// PutVhost creates a vhost (with its amq.* exchanges) or sets its limits,
// as an operator, and waits for it to be durable (with a metadata log).
func (b *Broker) PutVhost(ctx context.Context, v MetaVhost) error {
	return b.userCommand(ctx, &MetaCommand{Op: MetaPutVhost, Admin: true, Vhost: v})
}

// DeleteVhost deletes a vhost and everything in it (not_found if there is
// none; "/" cannot be deleted). Its queues are deleted through their
// shards first, as QUEUE_DELETE does (their consumers are told, a durable
// queue's log goes); the metadata command then removes the vhost with
// whatever is left (exchanges, bindings, permissions, a queue declared
// meanwhile), and the fronts close the vhost's connections (OnVhosts).
func (b *Broker) DeleteVhost(ctx context.Context, name string) error {
	if _, ok := b.Vhost(name); ok && name != DefaultVhost {
		prefix := QualifyName(name, "")
		for _, q := range b.topo.snapshotQueues() {
			if !strings.HasPrefix(q.name, prefix) {
				continue
			}
			if _, err := b.DeleteQueue(ctx, q.name, false, false); err != nil && ctx.Err() != nil {
				return err
			}
		}
	}
	return b.userCommand(ctx, &MetaCommand{Op: MetaDeleteVhost, Admin: true, Vhost: MetaVhost{Name: name}})
}
