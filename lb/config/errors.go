// SPDX-License-Identifier: Apache-2.0

package config

import (
	"slices"
	"strconv"
	"strings"
)

// Error is one problem found in a configuration, located precisely enough
// that an operator can jump to it: the file (or KV key) and line, and for
// problems inside a service, which service and backend.
type Error struct {
	// File is the name given to Parse, or the `where` given to ParseService.
	File string
	// Line is 1-based; 0 means the problem concerns the whole document (for
	// example a required table that is absent).
	Line int
	// Service is the service's name, or "#N" (its 1-based position) when it
	// has no usable name.
	Service string
	// Backend is the backend's address:port, or "#N" when its address is
	// unusable.
	Backend string
	// Key is the key the problem is about, as a path into the document
	// (`datapath.max_services`, `service[0].backend[1].address`); empty
	// when the problem is not about one key (a syntax error).
	Key string
	// Msg says what is wrong and what to do about it.
	Msg string
}

// Error formats the problem as `file:line: service "web": backend
// 10.1.0.11:30080: msg`, leaving out the parts that are empty, so editors and
// CI logs can link it to the offending line.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Service != "" {
		b.WriteString("service ")
		b.WriteString(strconv.Quote(e.Service))
		b.WriteString(": ")
	}
	if e.Backend != "" {
		b.WriteString("backend ")
		b.WriteString(e.Backend)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrorList is every problem found in one document, sorted by line. Parse,
// Load and ParseService return it as their error so that an operator fixes
// all problems in one edit instead of one per reload; get it back with
// errors.As.
type ErrorList []*Error

// Error returns one problem per line.
func (l ErrorList) Error() string {
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap exposes the individual problems, so errors.As can also extract the
// first *Error.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// sortByLine orders problems the way the operator reads the file; problems
// found on the same line keep the order in which they were found.
func (l ErrorList) sortByLine() {
	slices.SortStableFunc(l, func(a, b *Error) int { return a.Line - b.Line })
}
