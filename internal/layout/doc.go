// Package layout holds no code: its test checks the import rules of
// DESIGN.md §2 over the whole module, so a forbidden import fails
// `go test ./internal/layout` (and `make test`) rather than a review.
//
// The rules, each over every .go file of a package (tests included, build
// constraints ignored, so the check is stricter than any one build):
//
//  1. wire/ imports no other package of this module.
//  2. queue/ and segment/ import no package of this module but wire/ (and
//     their own sub-packages).
//  3. Nothing below netio (wire/, queue/, segment/, replication/, broker/)
//     imports netio/, admin/ or client/.
//  4. admin/ imports no package of this module but broker/ and wire/ (and
//     its own sub-packages) in its non-test files: it serves the operator
//     API in process, and what it needs of the connection layer is an
//     interface it defines, which netio's Server meets where warrend
//     composes them. Its tests may import netio and client.
//  5. No import cycles among the module's packages.
//
// The checker parses import clauses with go/parser; it needs neither the
// go command nor a build.
package layout
