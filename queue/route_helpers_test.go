package queue

import "slices"

// namedTable is a Routes snapshot built from a Topology (the reference
// model's input), with the queue names behind the refs, so tests written
// against names route through Routes.
type namedTable struct {
	*Table
	names []string // by QueueRef
}

// routesFrom feeds top into a fresh Routes (exchanges, then queues, then
// bindings, in a fixed order) and returns its table. Queue i in sorted
// order gets QueueRef i.
func routesFrom(top *Topology) namedTable {
	r := NewRoutes()
	exs := make([]string, 0, len(top.Exchanges))
	for name := range top.Exchanges {
		exs = append(exs, name)
	}
	slices.Sort(exs)
	for _, name := range exs {
		r.AddExchange(top.Exchanges[name])
	}
	names := make([]string, 0, len(top.Queues))
	for name := range top.Queues {
		names = append(names, name)
	}
	slices.Sort(names)
	for i, name := range names {
		r.AddQueue(name, QueueRef(i))
	}
	for _, b := range top.Bindings {
		r.Bind(b)
	}
	return namedTable{r.Table(), names}
}

// routeNames routes and returns the names of the queues, in route order.
func (n namedTable) routeNames(dst []string, exchange string, key, headers []byte) ([]string, bool) {
	refs, ok := n.Route(nil, exchange, key, headers)
	for _, ref := range refs {
		dst = append(dst, n.names[ref])
	}
	return dst, ok
}
