{{/* The chart's name, or nameOverride. */}}
{{- define "kvtier.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, else the release's name, with the
chart's name appended unless the release's name holds it already. */}}
{{- define "kvtier.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvtier.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvtier.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvtier.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvtier.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: kvtierd
{{- end -}}

{{/* A value as written, numbers without an exponent (YAML numbers reach
templates as float64). */}}
{{- define "kvtier.string" -}}
{{- if kindIs "float64" . -}}{{ printf "%.0f" . }}{{- else -}}{{ toString . | trim }}{{- end -}}
{{- end -}}

{{/* A size in bytes, as kvtierd's config.ParseByteSize reads it: a number
with an optional unit, Ki/KiB… powers of 1024, K/KB… powers of 1000, any
case. Argument: (list "valueName" value). */}}
{{- define "kvtier.bytes" -}}
{{- $name := index . 0 -}}
{{- $s := include "kvtier.string" (index . 1) -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $s -}}
{{- $unit := $s | trimPrefix $num | trim | lower -}}
{{- $units := dict "" 1 "b" 1 "k" 1e3 "kb" 1e3 "ki" 1024 "kib" 1024 "m" 1e6 "mb" 1e6 "mi" 1048576 "mib" 1048576 "g" 1e9 "gb" 1e9 "gi" 1073741824 "gib" 1073741824 "t" 1e12 "tb" 1e12 "ti" 1099511627776 "tib" 1099511627776 -}}
{{- if or (eq $num "") (not (hasKey $units $unit)) -}}
{{- fail (printf "%s: %q is not a size (32Gi, 32GiB, 32G or a number of bytes)" $name $s) -}}
{{- end -}}
{{- printf "%.0f" (mulf (float64 $num) (get $units $unit)) -}}
{{- end -}}

{{/* Bytes as a Kubernetes quantity: Gi or Mi where they divide it. */}}
{{- define "kvtier.quantity" -}}
{{- $b := int64 . -}}
{{- if and (gt $b 0) (eq (mod $b 1073741824) 0) -}}{{ div $b 1073741824 }}Gi
{{- else if and (gt $b 0) (eq (mod $b 1048576) 0) -}}{{ div $b 1048576 }}Mi
{{- else -}}{{ $b }}
{{- end -}}
{{- end -}}

{{/* The container's resources: values.resources, with the memory request
and limit set to poolBytes + memoryOverhead when limits.memory is unset;
a limits.memory below that fails the render. */}}
{{- define "kvtier.resources" -}}
{{- $res := deepCopy (default dict .Values.resources) -}}
{{- $need := addf (include "kvtier.bytes" (list "poolBytes" .Values.poolBytes)) (include "kvtier.bytes" (list "memoryOverhead" .Values.memoryOverhead)) -}}
{{- $limits := default dict (get $res "limits") -}}
{{- if hasKey $limits "memory" -}}
{{- $have := include "kvtier.bytes" (list "resources.limits.memory" (get $limits "memory")) -}}
{{- if lt (float64 $have) $need -}}
{{- fail (printf "resources.limits.memory (%s) must hold poolBytes (%s) plus memoryOverhead (%s): the pool's pages are charged to kvtierd's container" (include "kvtier.string" (get $limits "memory")) (include "kvtier.string" .Values.poolBytes) (include "kvtier.string" .Values.memoryOverhead)) -}}
{{- end -}}
{{- else -}}
{{- $mem := include "kvtier.quantity" (printf "%.0f" $need) -}}
{{- $requests := default dict (get $res "requests") -}}
{{- $_ := set $requests "memory" $mem -}}
{{- $_ := set $limits "memory" $mem -}}
{{- $_ := set $res "requests" $requests -}}
{{- $_ := set $res "limits" $limits -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{/* The directory of the pool file, by pool.mode. */}}
{{- define "kvtier.poolDir" -}}
{{- if eq .Values.pool.mode "hostIPC" -}}
/dev/shm
{{- else if eq .Values.pool.mode "hostPath" -}}
{{- required "pool.hostPath is required with pool.mode hostPath" .Values.pool.hostPath | trimSuffix "/" -}}
{{- else -}}
{{- fail (printf "pool.mode: %q is neither hostIPC nor hostPath" .Values.pool.mode) -}}
{{- end -}}
{{- end -}}

{{- define "kvtier.socketDir" -}}
{{- required "socketDir is required" .Values.socketDir | trimSuffix "/" -}}
{{- end -}}

{{/* kvtierd's config file, when values.config is not empty. */}}
{{- define "kvtier.configPath" -}}/etc/kvtier/kvtierd.yaml{{- end -}}
