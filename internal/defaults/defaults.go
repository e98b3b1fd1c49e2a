// Package defaults fills a config struct's unset fields from a struct
// literal of its defaults, so that a package declares its defaults once, as
// a value, instead of one if-statement per field.
//
// Only fields whose rule is "unset means the default" belong in the
// literal: a field with another rule (a negative value meaning "none", a
// default computed from other fields, a fresh pointer per config) keeps its
// own code next to the call.
package defaults

import (
	"fmt"
	"reflect"
)

// Fill sets every field of *dst that holds its type's zero value to the
// same field of def. A zero field of def has no default: the field is left
// as it is. def's values are copied as they are (a pointer, map or slice in
// def is shared by every config filled from it). dst must point to a
// struct, and def may set only exported fields; anything else panics.
func Fill[T any](dst *T, def T) { fill(dst, def, false) }

// FillNonPositive is Fill, but a negative number (an int of any size, a
// time.Duration, a float) in a field that has a default counts as unset
// too: for fields whose rule is "<= 0 means the default".
func FillNonPositive[T any](dst *T, def T) { fill(dst, def, true) }

func fill[T any](dst *T, def T, nonPositive bool) {
	d, v := reflect.ValueOf(dst).Elem(), reflect.ValueOf(def)
	if d.Kind() != reflect.Struct {
		panic(fmt.Sprintf("defaults: %s is not a struct", d.Type()))
	}
	for i := range d.NumField() {
		dv := v.Field(i)
		if dv.IsZero() {
			continue
		}
		f := d.Field(i)
		if !f.CanSet() {
			panic(fmt.Sprintf("defaults: %s.%s is unexported", d.Type(), d.Type().Field(i).Name))
		}
		if f.IsZero() || nonPositive && negative(f) {
			f.Set(dv)
		}
	}
}

func negative(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() < 0
	case reflect.Float32, reflect.Float64:
		return v.Float() < 0
	}
	return false
}
