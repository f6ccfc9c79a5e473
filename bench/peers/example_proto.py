"""tf.train.Example's messages (tensorflow/core/example/{example,feature}.proto), built from their
field numbers with protobuf's runtime, so that a process parses tf.Examples without importing
TensorFlow (Grain's workers, as a Grain user whose records are tf.Examples would)."""
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def _messages():
    f = descriptor_pb2.FileDescriptorProto(name="bench_example.proto", package="bench", syntax="proto3")
    label = descriptor_pb2.FieldDescriptorProto
    def message(name, *fields):
        m = f.message_type.add(name=name)
        for field_name, number, kind, repeated, type_name in fields:
            field = m.field.add(name=field_name, number=number, type=kind,
                                label=label.LABEL_REPEATED if repeated else label.LABEL_OPTIONAL)
            if type_name:
                field.type_name = type_name
            if repeated and kind != label.TYPE_BYTES and kind != label.TYPE_MESSAGE:
                field.options.packed = True
        return m
    message("BytesList", ("value", 1, label.TYPE_BYTES, True, None))
    message("FloatList", ("value", 1, label.TYPE_FLOAT, True, None))
    message("Int64List", ("value", 1, label.TYPE_INT64, True, None))
    feature = message("Feature", ("bytes_list", 1, label.TYPE_MESSAGE, False, ".bench.BytesList"),
                      ("float_list", 2, label.TYPE_MESSAGE, False, ".bench.FloatList"),
                      ("int64_list", 3, label.TYPE_MESSAGE, False, ".bench.Int64List"))
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message("Features", ("feature", 1, label.TYPE_MESSAGE, True, ".bench.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=label.TYPE_STRING, label=label.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=label.TYPE_MESSAGE, label=label.LABEL_OPTIONAL, type_name=".bench.Feature")
    message("Example", ("features", 1, label.TYPE_MESSAGE, False, ".bench.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Example"))


Example = _messages()
