package replication

import "sync"

// Pool runs the node's snapshot writes and log compactions on a few
// goroutines (design §3.1: a compactor pool of 4): each call blocks for a
// group commit, and several running at once share one. Share one Pool
// among a node's workers. Jobs run in the order given, at most Size at a
// time.
type Pool struct {
	mu     sync.Mutex
	cond   *sync.Cond
	jobs   []func()
	closed bool
	wg     sync.WaitGroup
	size   int
	active int
	peak   int
	inline bool
}

// NewPool starts a pool of n goroutines (n ≥ 1).
func NewPool(n int) *Pool {
	p := &Pool{size: max(1, n)}
	p.cond = sync.NewCond(&p.mu)
	for range p.size {
		p.wg.Add(1)
		go p.loop()
	}
	return p
}

func (p *Pool) loop() {
	defer p.wg.Done()
	p.mu.Lock()
	for {
		for len(p.jobs) == 0 && !p.closed {
			p.cond.Wait()
		}
		if len(p.jobs) == 0 {
			p.mu.Unlock()
			return
		}
		job := p.jobs[0]
		p.jobs[0] = nil
		p.jobs = p.jobs[1:]
		p.active++
		p.peak = max(p.peak, p.active)
		p.mu.Unlock()
		job()
		p.mu.Lock()
		p.active--
	}
}

// NewInlinePool returns a pool that runs each job at once, on the
// goroutine that calls Go (deterministic simulations: replication/sim).
func NewInlinePool() *Pool { return &Pool{inline: true} }

// Go queues job.
func (p *Pool) Go(job func()) {
	if p.inline {
		job()
		return
	}
	p.mu.Lock()
	p.jobs = append(p.jobs, job)
	p.mu.Unlock()
	p.cond.Signal()
}

// Peak is the most jobs that ran at once so far.
func (p *Pool) Peak() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peak
}

// Close runs the queued jobs, then stops the goroutines.
func (p *Pool) Close() {
	if p.inline {
		return
	}
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cond.Broadcast()
	p.wg.Wait()
}
