package queue

import "strings"

// topicNode is one level of the topic trie: a binding pattern's words are a
// path from the root; "*" and "#" have their own edges.
type topicNode struct {
	words map[string]*topicNode
	star  *topicNode // "*": exactly one word
	hash  *topicNode // "#": zero or more words
	dests []cdest
}

// insert adds a binding pattern. Words are split on '.', empty words count
// ("a..b" has three words; "" is one empty word). Consecutive "#" words are
// one "#" (they match the same keys), which also keeps matching polynomial.
func (n *topicNode) insert(pattern string, d cdest) {
	prev := ""
	for _, w := range strings.Split(pattern, ".") {
		if w == "#" && prev == "#" {
			continue
		}
		prev = w
		var next **topicNode
		switch w {
		case "*":
			next = &n.star
		case "#":
			next = &n.hash
		default:
			if n.words == nil {
				n.words = map[string]*topicNode{}
			}
			c := n.words[w]
			if c == nil {
				c = &topicNode{}
				n.words[w] = c
			}
			n = c
			continue
		}
		if *next == nil {
			*next = &topicNode{}
		}
		n = *next
	}
	n.dests = appendDest(n.dests, d)
}

// maxTopicWords: a routing key is at most 255 bytes, so at most 128 words.
const maxTopicWords = 128

// topicMatcher holds a routing key split into words without allocating.
type topicMatcher struct {
	key    []byte
	starts [maxTopicWords + 1]uint8
	ends   [maxTopicWords + 1]uint8
	n      int
}

func (m *topicMatcher) split(key []byte) {
	m.key, m.n = key, 0
	start := 0
	for i := 0; i <= len(key); i++ {
		if i == len(key) || key[i] == '.' {
			m.starts[m.n], m.ends[m.n] = uint8(start), uint8(i)
			m.n++
			start = i + 1
		}
	}
}

func (m *topicMatcher) word(i int) []byte { return m.key[m.starts[i]:m.ends[i]] }

// match calls found for every binding whose pattern matches words i.. of
// the key. Duplicates are possible (the caller dedups).
func (m *topicMatcher) match(n *topicNode, i int, found func(cdest)) {
	if n.hash != nil {
		// "#" swallows zero or more words.
		for j := i; j <= m.n; j++ {
			m.match(n.hash, j, found)
		}
	}
	if i == m.n {
		for _, d := range n.dests {
			found(d)
		}
		return
	}
	if n.words != nil {
		if c := n.words[string(m.word(i))]; c != nil {
			m.match(c, i+1, found)
		}
	}
	if n.star != nil {
		m.match(n.star, i+1, found)
	}
}
