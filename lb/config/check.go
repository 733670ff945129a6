// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pelletier/go-toml/v2"
)

// checker collects the problems of one document. Validation never stops at
// the first problem: every check records its finding and moves on.
type checker struct {
	file  string
	idx   *lineIndex
	json  bool // the document is JSON: name its types the JSON way
	errs  ErrorList
	warns ErrorList
}

// warn records a setting that works but is likely to harm the box.
func (c *checker) warn(line int, format string, args ...any) {
	c.warns = append(c.warns, &Error{File: c.file, Line: line, Msg: clipQuoted(fmt.Sprintf(format, clipArgs(args)...))})
}

func (c *checker) add(line int, service, backend, format string, args ...any) {
	c.errs = append(c.errs, &Error{
		File:    c.file,
		Line:    line,
		Service: service,
		Backend: backend,
		Msg:     clipQuoted(fmt.Sprintf(format, clipArgs(args)...)),
	})
}

// maxValueLen bounds how much of an operator's value an error repeats: a
// megabyte-long string must not become a megabyte-long log line. Longer
// strings are cut to clipLen.
const (
	maxValueLen = 256
	clipLen     = 128
)

// clipQuoted shortens every quoted string (Go syntax, as %q writes it)
// longer than maxValueLen in msg: values quoted by the parsers of other
// packages (lb.ParseProtocol and friends) reach a message already
// formatted, past clipArgs.
func clipQuoted(msg string) string {
	if len(msg) <= maxValueLen {
		return msg
	}
	var b strings.Builder
	for {
		start := strings.IndexByte(msg, '"')
		if start < 0 {
			break
		}
		end := start + 1
		for end < len(msg) && msg[end] != '"' {
			if msg[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(msg) {
			break // unbalanced: leave the rest as it is
		}
		b.WriteString(msg[:start+1])
		if inner := msg[start+1 : end]; len(inner) > maxValueLen {
			cut := clipLen
			for cut > 0 && (!utf8.RuneStart(inner[cut]) || inner[cut-1] == '\\') {
				cut--
			}
			fmt.Fprintf(&b, "%s… (%d bytes)", inner[:cut], len(inner))
		} else {
			b.WriteString(inner)
		}
		b.WriteByte('"')
		msg = msg[end+1:]
	}
	b.WriteString(msg)
	return b.String()
}

// clipArgs shortens long string arguments of an error message.
func clipArgs(args []any) []any {
	for i, a := range args {
		if s, ok := a.(string); ok && len(s) > maxValueLen {
			cut := clipLen
			for cut > 0 && !utf8.RuneStart(s[cut]) {
				cut--
			}
			args[i] = fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
		}
	}
	return args
}

func (c *checker) line(path string) int {
	if c.idx == nil {
		return 0
	}
	return c.idx.line(path)
}

// decodeTOML decodes data into v (a pointer to a raw struct) and indexes
// its lines. It returns false when the document cannot be decoded as meant
// (a syntax error, a table written as a plain value, a misplaced header);
// those problems are then the only ones reported, since nothing decoded
// after them can be trusted. Unknown keys do not stop decoding:
// they are returned for addStrict.
func (c *checker) decodeTOML(data []byte, v any) (*toml.StrictMissingError, bool) {
	err := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields().Decode(v)
	var strict *toml.StrictMissingError
	var de *toml.DecodeError
	switch {
	case err == nil, errors.As(err, &strict):
	case errors.As(err, &de):
		line, _ := de.Position()
		c.add(line, "", "", "%s", decodeErrorMsg(de))
		return nil, false
	default:
		c.add(0, "", "", "cannot decode TOML: %v", err)
		return nil, false
	}
	var issues []structural
	c.idx, issues = indexTOML(data, reflect.TypeOf(v).Elem())
	for _, is := range issues {
		c.add(is.line, "", "", "%s", is.msg)
	}
	// Values decoded under a misplaced header are not where the operator
	// meant them; checking them would only add confusing errors.
	return strict, len(issues) == 0
}

// decodeErrorMsg rewords the decoder's error for an operator. With `any`
// leaves, the only type errors left are tables written as values, and the
// decoder describes those with Go type names.
func decodeErrorMsg(de *toml.DecodeError) string {
	msg := strings.TrimPrefix(de.Error(), "toml: ")
	if rest, ok := strings.CutPrefix(msg, "cannot decode TOML "); ok {
		kind, _, _ := strings.Cut(rest, " into ")
		key := de.Key()
		name := strings.Join(key, ".")
		want := "a table"
		if len(key) > 0 {
			switch key[len(key)-1] {
			case "service", "backend", "peer":
				want = "an array of tables ([[" + name + "]])"
			default:
				want = "a table ([" + name + "])"
			}
		}
		return fmt.Sprintf("%s must be %s, not %s %s", name, want, article(kind), kind)
	}
	if strings.Contains(msg, "cannot store an array table") && len(de.Key()) > 0 {
		name := strings.Join(de.Key(), ".")
		return fmt.Sprintf("[[%s]] must be written [%s]: it is a single table, not an array of tables", name, name)
	}
	return "invalid TOML: " + msg
}

func article(word string) string {
	if word != "" && strings.ContainsRune("aeiou", rune(word[0])) {
		return "an"
	}
	return "a"
}

// addStrict reports the unknown keys and tables the decoder found. The
// decoder gives each one's line and key but not which array element it is
// in, so the line index supplies the full path, from which the service and
// backend are named.
func (c *checker) addStrict(strict *toml.StrictMissingError, services []rawService, root reflect.Type, fileMode bool) {
	if strict == nil {
		return
	}
	byLine := make(map[int][]string)
	for p, l := range c.idx.lines {
		byLine[l] = append(byLine[l], p)
	}
	for i := range strict.Errors {
		e := &strict.Errors[i]
		line, _ := e.Position()
		key := e.Key()
		name := ""
		if len(key) > 0 {
			name = key[len(key)-1]
		}
		path := c.pathAt(byLine, line, name)
		var table []string
		if path != "" {
			table = schemaParts(parentPath(path))
		} else if len(key) > 0 {
			table = key[:len(key)-1]
		}
		svc, be := labelsFor(path, services, fileMode)
		known := knownTags(orRoot(tableType(root, "toml", table), root), "toml")
		where := tableDisplay(root, table)
		noun := "key"
		if strings.HasSuffix(e.Error(), "missing table") {
			noun = "table"
		}
		c.add(line, svc, be, "%s", unknownKeyMsg(noun, name, where, known))
	}
}

func orRoot(t, root reflect.Type) reflect.Type {
	if t == nil {
		return root
	}
	return t
}

// pathAt finds the indexed path of key `name` defined on line; when several
// match (nested inline tables), the deepest wins. byLine is built once per
// document so that many unknown keys do not rescan the index each.
func (c *checker) pathAt(byLine map[int][]string, line int, name string) string {
	best := ""
	for _, p := range byLine[line] {
		if lastKey(p) != name {
			continue
		}
		if len(p) > len(best) || len(p) == len(best) && p < best {
			best = p
		}
	}
	return best
}

// lastKey returns the last key of a path, without an element index.
func lastKey(path string) string {
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		path = path[i+1:]
	}
	return path
}

// schemaParts strips the element indexes from a path: `service[1].backend[0]`
// becomes [service backend].
func schemaParts(path string) []string {
	if path == "" {
		return nil
	}
	parts := strings.Split(path, ".")
	for i, p := range parts {
		if j := strings.IndexByte(p, '['); j >= 0 {
			parts[i] = p[:j]
		}
	}
	return parts
}

// tableDisplay names a table the way it is written in the document.
func tableDisplay(root reflect.Type, table []string) string {
	if len(table) == 0 {
		return ""
	}
	name := strings.Join(table, ".")
	parent := orRoot(tableType(root, "toml", table[:len(table)-1]), root)
	if f, ok := fieldByTag(parent, "toml", table[len(table)-1]); ok && f.Type.Kind() == reflect.Slice {
		return "[[" + name + "]]"
	}
	return "[" + name + "]"
}

// labelsFor names the service and backend a path belongs to. In a config
// file, services are `service[i]`; in a standalone service document the
// whole document is services[0].
func labelsFor(path string, services []rawService, fileMode bool) (string, string) {
	if len(services) == 0 {
		return "", ""
	}
	i, rest := 0, path
	if fileMode {
		var ok bool
		if i, rest, ok = cutIndex(path, "service"); !ok || i >= len(services) {
			return "", ""
		}
	}
	rs := &services[i]
	svc := serviceLabel(rs, i)
	j, _, ok := cutIndex(strings.TrimPrefix(rest, "."), "backend")
	if !ok || j >= len(rs.Backend) {
		return svc, ""
	}
	return svc, backendLabel(&rs.Backend[j], rs.Port, j)
}

// cutIndex splits `name[3].rest` into 3 and `.rest`.
func cutIndex(path, name string) (int, string, bool) {
	rest, ok := strings.CutPrefix(path, name+"[")
	if !ok {
		return 0, "", false
	}
	end := strings.IndexByte(rest, ']')
	if end < 0 {
		return 0, "", false
	}
	n, err := strconv.Atoi(rest[:end])
	if err != nil {
		return 0, "", false
	}
	return n, rest[end+1:], true
}

// decodeJSON decodes a standalone service document written in JSON.
func (c *checker) decodeJSON(data []byte, raw *rawService) bool {
	c.json = true
	x, issues, fatal := indexJSON(data, reflect.TypeOf(*raw))
	c.idx = x
	if fatal != nil {
		c.add(fatal.line, "", "", "%s", fatal.msg)
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			want := "an object"
			if lastKey(te.Field) == "backend" {
				want = "an array of objects"
			}
			c.add(x.lineAt(int(te.Offset)), "", "", "%s must be %s, not %s", te.Field, want, te.Value)
		} else {
			c.add(0, "", "", "cannot decode JSON: %v", err)
		}
		return false
	}
	services := []rawService{*raw}
	for _, is := range issues {
		svc, be := labelsFor(is.path, services, false)
		c.add(is.line, svc, be, "%s", is.msg)
	}
	return true
}

// scope is where a check happens: the table's indexed path (for lines), the
// prefix its keys get in messages, and the service and backend it belongs to.
type scope struct {
	c       *checker
	path    string
	display string
	service string
	backend string
}

// sub returns the scope of a nested table.
func (s scope) sub(key string) scope {
	s.path = joinPath(s.path, key)
	s.display += key + "."
	return s
}

// name is how key is called in messages: `datapath.mode`, `health.port`,
// or plain `port` inside a service.
func (s scope) name(key string) string {
	return s.display + key
}

// errorf records a problem at key's line (or the table's when the key is
// absent). key may carry an element index, as in `source_ranges[1]`.
func (s scope) errorf(key, format string, args ...any) {
	path := joinPath(s.path, key)
	s.c.add(s.c.line(path), s.service, s.backend, format, args...)
	s.c.errs[len(s.c.errs)-1].Key = path
}

// problem records msg, a message this package composed (its values
// clipped already), at key's line as errorf does.
func (s scope) problem(key, msg string) {
	path := joinPath(s.path, key)
	s.c.errs = append(s.c.errs, &Error{File: s.c.file, Line: s.c.line(path), Service: s.service, Backend: s.backend, Key: path, Msg: msg})
}

// warnf records a warning at key's line (or the table's when the key is
// absent), naming the scope's service and backend as errorf does.
func (s scope) warnf(key, format string, args ...any) {
	path := s.path
	if key != "" {
		path = joinPath(s.path, key)
	}
	s.c.warns = append(s.c.warns, &Error{File: s.c.file, Line: s.c.line(path), Service: s.service, Backend: s.backend, Key: path,
		Msg: clipQuoted(fmt.Sprintf(format, clipArgs(args)...))})
}

// kindOf names the type of a decoded value for "want X, got Y" messages.
func (s scope) kindOf(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case json.Number:
		if _, err := v.Int64(); err == nil {
			return "integer " + v.String()
		}
		return "number " + v.String()
	case float64:
		return "float " + strconv.FormatFloat(v, 'g', -1, 64)
	case bool:
		return "boolean " + strconv.FormatBool(v)
	case []any:
		return "an array"
	case map[string]any:
		if s.c.json {
			return "an object"
		}
		return "a table"
	case nil:
		return "null"
	case toml.LocalDate, toml.LocalTime, toml.LocalDateTime, time.Time:
		return "a date/time"
	}
	return fmt.Sprintf("a %T", v)
}

func (s scope) wrongType(key string, v any, want string) {
	s.errorf(key, "%s must be %s, not %s", s.name(key), want, s.kindOf(v))
}

// str converts a string value. ok is false when the key is absent or holds
// something else (which is then reported).
func (s scope) str(key string, v any) (string, bool) {
	if v == nil {
		return "", false
	}
	x, ok := v.(string)
	if !ok {
		s.wrongType(key, v, "a string")
	}
	return x, ok
}

// integer converts an integer value. JSON integers arrive as json.Number.
func (s scope) integer(key string, v any) (int64, bool) {
	switch x := v.(type) {
	case nil:
		return 0, false
	case int64:
		return x, true
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n, true
		}
		if _, err := strconv.ParseFloat(x.String(), 64); err != nil {
			// An integer literal too large for int64.
			s.errorf(key, "%s = %s is out of range", s.name(key), x)
			return 0, false
		}
	}
	s.wrongType(key, v, "an integer")
	return 0, false
}

// intIn converts an integer that must lie in [lo, hi]; 64-bit decoding
// means 70000 for a port is reported as out of range, not as a type error.
func (s scope) intIn(key string, v any, lo, hi int64, hint string) (int64, bool) {
	n, ok := s.integer(key, v)
	if !ok {
		return 0, false
	}
	if n < lo || n > hi {
		s.errorf(key, "%s = %d is out of range: %s", s.name(key), n, hint)
		return 0, false
	}
	return n, true
}

func (s scope) port(key string, v any) (uint16, bool) {
	n, ok := s.intIn(key, v, 1, 65535, "use a port in 1..65535")
	return uint16(n), ok
}

// boolean converts a true/false value.
func (s scope) boolean(key string, v any) (bool, bool) {
	if v == nil {
		return false, false
	}
	x, ok := v.(bool)
	if !ok {
		s.wrongType(key, v, "true or false")
	}
	return x, ok
}

// strs converts an array of strings; a wrong element is reported at its
// own index and left out.
func (s scope) strs(key string, v any) ([]string, bool) {
	if v == nil {
		return nil, false
	}
	arr, ok := v.([]any)
	if !ok {
		s.wrongType(key, v, "an array of strings")
		return nil, false
	}
	out := make([]string, 0, len(arr))
	good := true
	for i, e := range arr {
		str, ok := e.(string)
		if !ok {
			s.wrongType(indexPath(key, i), e, "a string")
			good = false
			continue
		}
		out = append(out, str)
	}
	return out, good
}

// duration converts a Go duration string that must be positive.
func (s scope) duration(key string, v any) (time.Duration, bool) {
	str, ok := s.str(key, v)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(str)
	if err != nil {
		s.errorf(key, "%s = %q is not a duration: write it like \"500ms\", \"5s\" or \"3h\"", s.name(key), str)
		return 0, false
	}
	if d <= 0 {
		s.errorf(key, "%s = %q must be positive", s.name(key), str)
		return 0, false
	}
	return d, true
}

// enum converts a string through a parse function from package lb (or a
// local one); their errors already list the accepted values.
func enum[T any](s scope, key string, v any, parse func(string) (T, error)) (T, bool) {
	var zero T
	str, ok := s.str(key, v)
	if !ok {
		return zero, false
	}
	x, err := parse(str)
	if err != nil {
		s.errorf(key, "%s: %v", s.name(key), err)
		return zero, false
	}
	return x, true
}
